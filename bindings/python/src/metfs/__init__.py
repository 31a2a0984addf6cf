"""metfs: mini-epoch training (MET) over a FUSE mount, from Python.

The daemon (``metfs mount``) shows the current mini-epoch of a dataset under a read-only mount
and stages the next one meanwhile; after each pass over the current mini-epoch the training job
reports its metrics over the control socket and the daemon answers ``repeat``, ``advance`` or
``wait``. This package is the reference client of that socket:

- :class:`Client`: the socket client (``hello``, ``status``, ``files``, ``release``,
  ``pass_end``, ``advance``, ``apply``); errors raise :class:`MetfsError` with an
  :data:`ErrorCode` (or a code of the client's own). ``files`` with ``direct`` gives the view's
  files as their copies in the cache, read without FUSE under a lease on the view: a view's
  ``paths`` (and a pass's) are always what to open, its ``mount_paths`` the files under the
  mount.
- :func:`passes`: a loop of :class:`Pass` objects, one per pass, until N MET epochs are done.
- :mod:`metfs.keras`, :mod:`metfs.torch`, :mod:`metfs.lightning`: framework integrations
  (imported on demand; the core needs only the standard library).
- The control socket's parts: :mod:`metfs.protocol` (the requests and their types),
  :mod:`metfs.replies`, :mod:`metfs.status` and :mod:`metfs.views` (the typed replies),
  :mod:`metfs.errors`, :mod:`metfs.wire` (the transport).
- :mod:`metfs.coordinator`: agreement across the ranks of a multi-node job.
- :mod:`metfs.batchsize`: ADJUST_BS (paper 003): per-rank batch sizes from the nodes' throughputs,
  changed by every rank together when AntDT's trigger finds a straggler.
"""

from . import _version
from .client import Client
from .coordinator import (
    Coordinator,
    LocalCoordinator,
    TorchDistributedCoordinator,
    default_coordinator,
)
from .errors import ErrorCode, MetfsConnectionError, MetfsError
from .loop import Pass, Passes, PassRecord, passes
from .metrics import metrics_to_floats
from .protocol import PROTOCOL_VERSION, DecisionKind
from .replies import Decision, Hello, NotResumed
from .signals import FreshLoss, PassSignals
from .status import Status
from .views import FilesView

__version__ = _version.version()

__all__ = [
    "PROTOCOL_VERSION",
    "Client",
    "Coordinator",
    "Decision",
    "DecisionKind",
    "ErrorCode",
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
