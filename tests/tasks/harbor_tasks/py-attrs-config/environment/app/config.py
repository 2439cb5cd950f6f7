import attrs


def _port_ok(instance, attribute, value):
    if value < 0:
        raise ValueError(f"port must be positive, got {value}")


@attrs.define
class ServerConfig:
    host: str = "localhost"
    port: int = attrs.field(default=8080, validator=_port_ok)
    workers: int = 1
