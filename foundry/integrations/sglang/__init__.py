"""The SGLang plugin: SAVE and LOAD a real SGLang server's CUDA graphs at serve time.

Registered in SGLang's ``sglang.srt.plugins`` entry-point group
(:func:`foundry.integrations.sglang.plugin.register`), configured by
``foundry run`` or ``FOUNDRY_SGLANG_CONFIG`` (:mod:`.config`), patched in only at
the hook points :mod:`.hookpoints` lists for the SGLang versions they were
checked against. See docs/sglang.md.
"""
