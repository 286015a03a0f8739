"""forkbox: the Python SDK of forkbox, self-hosted sandboxes for AI agents.

Sandboxes, exec (streamed), forks, checkpoints, restore and resume,
credentials and environments, over the daemon's Connect API (its unix socket,
or TCP with a bearer token). Standard library only.

    import sys, forkbox

    client = forkbox.Client(max_concurrency=10)
    with client.sandbox(image="forkbox.local/busybox:latest",
                        resources={"cpu": "1", "memory": "512Mi"}, name="my-job") as sb:
        sb.exec("make deps").wait()
        with sb.fork("after-deps") as fork:
            a = sb.exec("make test").pipe(sys.stdout)
            b = fork.exec("make build").pipe(sys.stdout)
            a.wait(), b.wait()

``forkbox.AsyncClient`` is the same API for asyncio.
"""

from ._models import (
    BuildProgress,
    BuildResult,
    Checkpoint,
    Credential,
    EnvironmentDefinition,
    EnvironmentInfo,
    Event,
    ExecChunk,
    ExecResult,
    FileInfo,
    ForkChild,
    ForkEvent,
    ForkResult,
    Handover,
    Image,
    ImageProgress,
    Overrides,
    PortURL,
    ReplayedExec,
    Resources,
    Resumed,
    SandboxInfo,
    SandboxMetrics,
    SandboxPage,
    Step,
    WriteFile,
)
from .aio import AsyncClient, AsyncCredentials, AsyncEnvironment, AsyncExecution, AsyncSandbox
from .client import DEFAULT_SOCKET, Client
from .environment import Environment
from .errors import (
    AlreadyExistsError,
    CanceledError,
    DeadlineExceededError,
    ExecError,
    FailedPreconditionError,
    ForkboxError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    UnknownError,
)
from .execution import DEFAULT_MAX_OUTPUT_BYTES, Execution
from .sandbox import Credentials, Sandbox

__version__ = "0.1.0"

__all__ = [
    "Client",
    "AsyncClient",
    "DEFAULT_SOCKET",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "Sandbox",
    "AsyncSandbox",
    "Credentials",
    "AsyncCredentials",
    "Execution",
    "AsyncExecution",
    "Environment",
    "AsyncEnvironment",
    "Resources",
    "Overrides",
    "PortURL",
    "WriteFile",
    "Step",
    "SandboxInfo",
    "SandboxMetrics",
    "SandboxPage",
    "ExecResult",
    "ExecChunk",
    "FileInfo",
    "Event",
    "Checkpoint",
    "Credential",
    "ForkChild",
    "ForkEvent",
    "ForkResult",
    "ReplayedExec",
    "Resumed",
    "Handover",
    "Image",
    "ImageProgress",
    "EnvironmentDefinition",
    "EnvironmentInfo",
    "BuildProgress",
    "BuildResult",
    "ForkboxError",
    "InvalidArgumentError",
    "NotFoundError",
    "AlreadyExistsError",
    "FailedPreconditionError",
    "UnavailableError",
    "ResourceExhaustedError",
    "PermissionDeniedError",
    "UnauthenticatedError",
    "DeadlineExceededError",
    "CanceledError",
    "UnimplementedError",
    "InternalError",
    "UnknownError",
    "ExecError",
]
