"""The vLLM plugin: SAVE and LOAD a real vLLM engine's CUDA graphs at serve time.

Registered in vLLM's ``vllm.general_plugins`` entry-point group
(:func:`foundry.integrations.vllm.plugin.register`, run in every process vLLM
starts), configured by ``foundry run`` or ``FOUNDRY_VLLM_CONFIG`` (:mod:`.config`),
patched in only at the hook points :mod:`.hookpoints` lists for the vLLM versions
they were checked against. See docs/vllm.md.
"""
