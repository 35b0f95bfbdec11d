"""The run builder moved to :mod:`tests.support.runbuilder` (every test folder
shares it); ``from runbuilder import ...`` in this folder still finds it here."""

from tests.support.runbuilder import RunBuilder, loop

__all__ = ["RunBuilder", "loop"]
