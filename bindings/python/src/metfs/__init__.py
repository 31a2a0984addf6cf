"""metfs: mini-epoch training (MET) over a FUSE mount, from Python.

The daemon (``metfs mount``) shows the current mini-epoch of a dataset under a read-only mount
and stages the next one meanwhile; after each pass over the current mini-epoch the training job
reports its metrics over the control socket and the daemon answers ``repeat``, ``advance`` or
``wait``. This package is the reference client of that socket:

- :class:`Client`: the socket client (``hello``, ``status``, ``files``, ``release``,
  ``pass_end``, ``advance``, ``apply``); errors raise :class:`MetfsError`. ``files`` with
  ``direct`` also gives the view's files as their copies in the cache, read without FUSE
  under a lease on the view.
- :func:`passes`: a loop of :class:`Pass` objects, one per pass, until N MET epochs are done.
- :mod:`metfs.keras`, :mod:`metfs.torch`, :mod:`metfs.lightning`: framework integrations
  (imported on demand; the core needs only the standard library).
- :mod:`metfs.coordinator`: agreement across the ranks of a multi-node job.
- :mod:`metfs.batchsize`: ADJUST_BS (paper 003): per-rank batch sizes from the nodes' throughputs,
  changed by every rank together when AntDT's trigger finds a straggler.
"""

from . import _version
from .client import (
    PROTOCOL_VERSION,
    Client,
    Decision,
    DecisionKind,
    FilesView,
    Hello,
    MetfsConnectionError,
    MetfsError,
    NotResumed,
    Status,
    metrics_to_floats,
)
from .coordinator import (
    Coordinator,
    LocalCoordinator,
    TorchDistributedCoordinator,
    default_coordinator,
)
from .loop import Pass, Passes, PassRecord, passes
from .signals import FreshLoss, PassSignals

__version__ = _version.version()

__all__ = [
    "PROTOCOL_VERSION",
    "Client",
    "Coordinator",
    "Decision",
    "DecisionKind",
    "FilesView",
    "FreshLoss",
    "Hello",
    "LocalCoordinator",
    "MetfsConnectionError",
    "MetfsError",
    "NotResumed",
    "Pass",
    "PassRecord",
    "PassSignals",
    "Passes",
    "Status",
    "TorchDistributedCoordinator",
    "__version__",
    "default_coordinator",
    "metrics_to_floats",
    "passes",
]
