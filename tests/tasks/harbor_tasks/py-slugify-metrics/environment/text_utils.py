def slugify(text: str) -> str:
    raise NotImplementedError
