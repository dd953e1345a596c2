"""The thin asyncio layer: framed connections, TCP server and worker client, timers."""
