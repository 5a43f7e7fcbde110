"""Where a plugin patches its engine, and the refusal of an engine version the
table was not checked against.

Each engine's table (``foundry.integrations.<engine>.hookpoints``) names every
function or method it patches by its dotted path, with the parameters it had in
the checked versions; the contract tests parse those versions' sources with
``ast`` and fail when a point is gone or its parameters changed. A handler that
stands in for the engine's own code (rather than running before, around or after
it) also records the digest of the body it was written against, so a change
there fails the same tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from foundry.errors import FoundryError

HOOK_TYPES = ("BEFORE", "AROUND", "AFTER")


@dataclass(frozen=True)
class HookPoint:
    """One patched function: where it is, what it looked like, why and how it is patched."""

    target: str  # module path, then class and function: a.b.c.Class.method or a.b.c.function
    module: str  # the module that holds it (defines it, or imports it from ``defined_in``)
    parameters: tuple[str, ...]  # positional parameter names in the checked versions
    why: str
    hook: str  # BEFORE, AROUND or AFTER (SGLang's HookType; the same meaning in patching)
    handler: str  # the function in the plugin module that runs there
    body_sha256: str | None = None  # AROUND handlers that replace the body: sha256 of ast.dump of the one checked
    # a module function ``module`` imports by name from another module: patched where ``module`` calls it
    defined_in: str | None = None

    def __post_init__(self) -> None:
        if self.hook not in HOOK_TYPES:
            raise FoundryError("unknown hook type", field="hook", expected=list(HOOK_TYPES), found=self.hook)
        if not self.target.startswith(self.module + "."):
            raise FoundryError("a hook point's target lies outside its module", field="target", found=self.target)

    @property
    def owner(self) -> str:
        """The dotted path of what holds the attribute (a class or the module)."""
        return self.target.rpartition(".")[0]

    @property
    def attribute(self) -> str:
        """The patched attribute's name."""
        return self.target.rpartition(".")[2]


def check_version(engine: str, version: str, checked: tuple[str, ...]) -> None:
    """Refuse a version of ``engine`` (``sglang``, ``vllm``) that the hook points were
    not checked against; said before anything is patched."""
    if version not in checked:
        raise FoundryError(
            f"this {ENGINE_NAMES.get(engine, engine)} version was not checked against Foundry's hook points; "
            "nothing was patched",
            field=f"{engine}.version",
            expected=list(checked),
            found=version,
        )


ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}
