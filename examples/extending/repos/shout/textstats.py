def shout(text):
    """The text in upper case with an exclamation mark."""
    return text.lower() + "!"
