"""The one exception users catch."""


class PockError(ValueError):
    """Bad input to PockEngine: the message names the problem (a wrong shape,
    dtype or count, an unsupported op and its module, a corrupt checkpoint...)."""
