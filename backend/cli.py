"""The backend's command: ``ckptlab serve`` (the REST API and the frontend, no worker)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from ckptlab.settings import Settings, get_settings

__all__ = ["app", "serve_forever", "settings_with"]

app = typer.Typer(add_completion=False)
console = Console()


def settings_with(host: str | None, port: int | None) -> Settings:
    """The process's settings with ``host`` / ``port`` overridden when given; the data folder
    is created."""
    s = get_settings().model_copy(update={k: v for k, v in {"host": host, "port": port}.items() if v})
    s.data_dir.mkdir(parents=True, exist_ok=True)
    return s


def serve_forever(settings: Settings) -> None:
    """Run the API with uvicorn on ``settings.host:settings.port`` until stopped."""
    import uvicorn

    from ckptlab.backend.app import create_app

    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="bind address (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="port (default 8000)")] = None,
) -> None:
    """Serve the REST API and the frontend."""
    s = settings_with(host, port)
    console.print(f"ckptlab API on http://{s.host}:{s.port}")
    serve_forever(s)
