"""The catalog of an archive in a few lines: GPU, CUDA, torch, world size, modules, model."""

from __future__ import annotations

from rich.table import Table
from textual.widgets import Static

from foundry.archive.schema import Catalog
from foundry.text import plain


def catalog_table(catalog: Catalog) -> Table:
    env = catalog.environment
    table = Table.grid(padding=(0, 1))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("gpu", plain(env.gpu_name))
    table.add_row("sm", plain(env.compute_capability))
    table.add_row("cuda", plain(env.cuda_version))
    table.add_row("driver", plain(env.driver_version))
    table.add_row("torch", plain(env.torch_version or "-"))
    table.add_row("world", str(catalog.world_size))
    table.add_row("modules", f"{catalog.modules.state.value} ({len(catalog.modules.blobs)})")
    model = catalog.model.get("model")
    if model:
        table.add_row("model", plain(model, style="green"))
    return table


class ArchiveInfo(Static):
    """The archive's environment as the catalog records it."""

    def __init__(self, catalog: Catalog, **kwargs) -> None:
        super().__init__(catalog_table(catalog), **kwargs)
