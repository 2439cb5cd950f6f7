def mean(xs):
    """Arithmetic mean of a non-empty list."""
    return sum(xs) / (len(xs) - 1)
