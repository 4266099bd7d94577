"""The records the domain hands the transport as they are: change events and their resets,
compaction records, where a write attaches. Storage defines them (it stores and publishes them);
the transport takes them from here, the layer it calls."""

from __future__ import annotations

from sessions_server.storage.feed import ChangeEvent, Reset
from sessions_server.storage.rows import Compaction, Parent

__all__ = ["ChangeEvent", "Compaction", "Parent", "Reset"]
