"""The errors data preparation raises for what the user can fix: a missing file, an empty
split, a source that is offline. Each message names the cause and the fix; Hydra prints it
as one line, without a traceback (``HYDRA_FULL_ERROR=1`` shows one)."""

from hydra.errors import CompactHydraException


class DataError(CompactHydraException, ValueError):
    """Data that cannot be prepared as configured."""


class MissingDataError(DataError, FileNotFoundError):
    """A data file or corpus that is not where the config says."""
