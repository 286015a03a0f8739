"""The SDK's data: plain dataclasses, built from the API's JSON messages.

The API speaks proto3 JSON: lowerCamelCase names, 64-bit integers as strings,
bytes as base64, default values left out. Everything here converts that into
Python values once (``int``, ``bytes``, ``datetime`` in UTC), so callers never
see raw JSON.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Union

if TYPE_CHECKING:
    from .errors import ForkboxError
    from .sandbox import Sandbox

Json = Dict[str, Any]


def _int(v: Any) -> int:
    return int(v) if v not in (None, "") else 0


def _float(v: Any) -> float:
    return float(v) if v not in (None, "") else 0.0


def _time(ms: Any) -> Optional[datetime]:
    """A unix time in milliseconds as an aware UTC datetime (None when unset)."""
    n = _int(ms)
    return datetime.fromtimestamp(n / 1000, tz=timezone.utc) if n else None


def b64decode(v: Any) -> bytes:
    return base64.b64decode(v) if v else b""


def b64encode(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


@dataclass
class Resources:
    """A sandbox's limits: CPU cores ("1", "0.5"), memory ("512Mi", "1Gi"), processes."""

    cpu: str = ""
    memory: str = ""
    pids: int = 0

    @classmethod
    def of(cls, v: Union["Resources", Mapping[str, Any], None]) -> Optional["Resources"]:
        """Accepts a Resources, a dict like {"cpu": "1", "memory": "512Mi"}, or None."""
        if v is None or isinstance(v, Resources):
            return v
        unknown = set(v) - {"cpu", "memory", "pids"}
        if unknown:
            from .errors import InvalidArgumentError

            raise InvalidArgumentError(
                f"resources: unknown keys {sorted(unknown)} (want cpu, memory, pids)"
            )
        return cls(
            cpu=str(v.get("cpu", "")), memory=str(v.get("memory", "")), pids=int(v.get("pids", 0))
        )

    def to_json(self) -> Json:
        return {"cpu": self.cpu, "memory": self.memory, "pids": str(self.pids)}

    @classmethod
    def from_json(cls, d: Optional[Json]) -> "Resources":
        d = d or {}
        return cls(cpu=d.get("cpu", ""), memory=d.get("memory", ""), pids=_int(d.get("pids")))


@dataclass
class Overrides:
    """What a child (or a restored sandbox) gets instead of what it inherits."""

    resources: Optional[Resources] = None
    #: Merged over the inherited env.
    env: Optional[Dict[str, str]] = None
    cwd: str = ""
    egress: str = ""
    name: str = ""

    @classmethod
    def of(cls, v: Union["Overrides", Mapping[str, Any], None]) -> Optional["Overrides"]:
        """Accepts an Overrides, a dict with the same keys, or None."""
        if v is None or isinstance(v, Overrides):
            return v
        unknown = set(v) - {"resources", "env", "cwd", "egress", "name"}
        if unknown:
            from .errors import InvalidArgumentError

            raise InvalidArgumentError(f"overrides: unknown keys {sorted(unknown)}")
        return cls(
            resources=Resources.of(v.get("resources")),
            env=v.get("env"),
            cwd=v.get("cwd", ""),
            egress=v.get("egress", ""),
            name=v.get("name", ""),
        )

    def to_json(self) -> Json:
        d: Json = {"cwd": self.cwd, "egress": self.egress, "name": self.name}
        if self.resources is not None:
            d["resources"] = self.resources.to_json()
        if self.env:
            d["env"] = dict(self.env)
        return d


@dataclass
class SandboxInfo:
    """What the daemon knows of a sandbox."""

    id: str
    name: str
    #: creating, running, paused, hibernating, hibernated, degraded, failed, closing, closed.
    state: str
    image: str = ""
    image_digest: str = ""
    resources: Resources = field(default_factory=Resources)
    env: Dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    egress: str = ""
    runtime: str = ""
    hostname: str = ""
    ip: str = ""
    created_at: Optional[datetime] = None
    snapshotter: str = ""
    error: str = ""
    #: The checkpoint this sandbox was started from, if any.
    from_checkpoint: str = ""
    #: The sandbox this one was forked from, if any.
    parent_id: str = ""
    #: Names of the credentials attached (never the values).
    credentials: List[str] = field(default_factory=list)
    machine_id: str = ""
    #: When the sandbox's lifetime ends (its timeout, or the daemon's
    #: --max-lifetime), or None when it has no deadline.
    expires_at: Optional[datetime] = None
    #: The sandbox's own timeout in seconds (0: none), counted from its
    #: creation or the last set_timeout().
    timeout: float = 0.0
    #: What happens at the deadline: "close" or "hibernate".
    on_timeout: str = ""
    #: The egress allow and deny lists (names, ``*.`` wildcards, CIDRs).
    egress_allow: List[str] = field(default_factory=list)
    egress_deny: List[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: Json) -> "SandboxInfo":
        return cls(
            id=d.get("id", ""),
            name=d.get("name", ""),
            state=d.get("state", ""),
            image=d.get("image", ""),
            image_digest=d.get("imageDigest", ""),
            resources=Resources.from_json(d.get("resources")),
            env=dict(d.get("env") or {}),
            cwd=d.get("cwd", ""),
            egress=d.get("egress", ""),
            runtime=d.get("runtime", ""),
            hostname=d.get("hostname", ""),
            ip=d.get("ip", ""),
            created_at=_time(d.get("createdAtUnixMs")),
            snapshotter=d.get("snapshotter", ""),
            error=d.get("error", ""),
            from_checkpoint=d.get("fromCheckpoint", ""),
            parent_id=d.get("parentId", ""),
            credentials=list(d.get("credentials") or []),
            machine_id=d.get("machineId", ""),
            expires_at=_time(d.get("expiresAtUnixMs")),
            timeout=_int(d.get("timeoutMs")) / 1000,
            on_timeout=d.get("onTimeout", ""),
            egress_allow=list(d.get("egressAllow") or []),
            egress_deny=list(d.get("egressDeny") or []),
        )


@dataclass
class SandboxPage:
    """One page of the sandbox list, oldest first; ``next_page_token`` is ""
    on the last page."""

    sandboxes: List[SandboxInfo]
    next_page_token: str


@dataclass
class ExecResult:
    """How a command ended, and what it printed (the last max_output_bytes of each stream)."""

    exit_code: int
    #: The signal that ended it ("SIGKILL"), or "".
    signal: str = ""
    stdout: str = ""
    stderr: str = ""
    #: More than max_output_bytes of stdout was printed: stdout holds its tail.
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: float = 0.0
    timed_out: bool = False
    oom_killed: bool = False

    @property
    def ok(self) -> bool:
        """The command exited 0, by itself."""
        return (
            self.exit_code == 0 and not self.signal and not self.timed_out and not self.oom_killed
        )


@dataclass
class ExecChunk:
    """A piece of a command's output, as it was produced."""

    #: "stdout" or "stderr".
    stream: str
    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclass
class FileInfo:
    name: str
    size: int = 0
    mode: int = 0
    is_dir: bool = False
    modified_at: Optional[datetime] = None

    @classmethod
    def from_json(cls, d: Json) -> "FileInfo":
        return cls(
            name=d.get("name", ""),
            size=_int(d.get("size")),
            mode=_int(d.get("mode")),
            is_dir=bool(d.get("dir", False)),
            modified_at=_time(d.get("mtimeUnixMs")),
        )


@dataclass
class Event:
    """One entry of a sandbox's ledger."""

    seq: int
    sandbox_id: str
    #: "sandbox.created", "exec.finished", "sandbox.checkpoint_created", ...
    type: str
    time: Optional[datetime]
    #: The event's attributes.
    data: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Json) -> "Event":
        try:
            data = json.loads(d.get("dataJson") or "{}")
        except ValueError:
            data = {}
        return cls(
            seq=_int(d.get("seq")),
            sandbox_id=d.get("sandboxId", ""),
            type=d.get("type", ""),
            time=_time(d.get("timeUnixMs")),
            data=data if isinstance(data, dict) else {},
        )


@dataclass
class Checkpoint:
    """An immutable capture of a sandbox (its ID, "ck-…", is what restore takes)."""

    id: str
    sandbox_id: str = ""
    sandbox_name: str = ""
    tag: str = ""
    created_at: Optional[datetime] = None
    #: Bytes written by the sandbox on top of its image.
    size: int = 0
    #: "filesystem" or "filesystem+memory".
    kind: str = ""
    image: str = ""
    #: How long the sandbox was frozen (freeze + snapshot + thaw).
    capture_ms: float = 0.0
    #: Writeback of dirty data before the freeze (while it ran).
    flush_ms: float = 0.0

    @classmethod
    def from_json(cls, d: Json) -> "Checkpoint":
        return cls(
            id=d.get("id", ""),
            sandbox_id=d.get("sandboxId", ""),
            sandbox_name=d.get("sandboxName", ""),
            tag=d.get("tag", ""),
            created_at=_time(d.get("createdAtUnixMs")),
            size=_int(d.get("size")),
            kind=d.get("kind", ""),
            image=d.get("image", ""),
            capture_ms=_float(d.get("captureMs")),
            flush_ms=_float(d.get("flushMs")),
        )


@dataclass
class SandboxMetrics:
    """One reading of a sandbox's counters. Under gVisor CPU, memory and
    pids are those of the sandbox's host cgroup (the runtime included);
    under crun its processes' own."""

    sandbox_id: str = ""
    name: str = ""
    state: str = ""
    runtime: str = ""
    time: Optional[datetime] = None
    #: CPU time since the sandbox started; a rate is the difference of two
    #: readings over their time difference.
    cpu_seconds: float = 0.0
    #: The CPU limit in cores (0: none).
    cpu_limit: float = 0.0
    memory_bytes: int = 0
    memory_limit_bytes: int = 0
    #: What the writable layer holds of its own, and its limit (0: none).
    disk_bytes: int = 0
    disk_limit_bytes: int = 0
    net_rx_bytes: int = 0
    net_tx_bytes: int = 0
    pids: int = 0
    pids_limit: int = 0
    #: Counters that could not be read this time, by name, with why.
    unavailable: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Json) -> "SandboxMetrics":
        return cls(
            sandbox_id=d.get("sandboxId", ""),
            name=d.get("name", ""),
            state=d.get("state", ""),
            runtime=d.get("runtime", ""),
            time=_time(d.get("timeUnixMs")),
            cpu_seconds=_float(d.get("cpuSeconds")),
            cpu_limit=_float(d.get("cpuLimit")),
            memory_bytes=_int(d.get("memoryBytes")),
            memory_limit_bytes=_int(d.get("memoryLimitBytes")),
            disk_bytes=_int(d.get("diskBytes")),
            disk_limit_bytes=_int(d.get("diskLimitBytes")),
            net_rx_bytes=_int(d.get("netRxBytes")),
            net_tx_bytes=_int(d.get("netTxBytes")),
            pids=_int(d.get("pids")),
            pids_limit=_int(d.get("pidsLimit")),
            unavailable=dict(d.get("unavailable") or {}),
        )


@dataclass
class PortURL:
    """How to reach one port of a sandbox through the daemon's preview
    listener (``forkbox serve --ports ADDR``). Every URL carries the
    sandbox's port token: it opens this sandbox's ports and nothing else."""

    #: The host form with the token: the link to share.
    url: str = ""
    #: The port token (send it as the X-Forkbox-Port-Token header instead).
    token: str = ""
    #: The preview host and port, ``<port>-<id>.<domain>:<p>``.
    host: str = ""
    #: The host form (the same as url).
    host_url: str = ""
    #: The path form, for non-browser clients that cannot set Host. It takes
    #: no cookie: send the token (query or X-Forkbox-Port-Token) each time.
    path_url: str = ""

    @classmethod
    def from_json(cls, d: Json) -> "PortURL":
        return cls(
            url=d.get("url", ""),
            token=d.get("token", ""),
            host=d.get("host", ""),
            host_url=d.get("hostUrl", ""),
            path_url=d.get("pathUrl", ""),
        )


@dataclass
class Credential:
    """A credential's description (its value is never returned)."""

    name: str
    #: Injected as this environment variable into every exec ("" = not).
    env: str = ""
    #: Written to /run/secrets/<file> ("" = not).
    file: str = ""
    #: Not copied to forks: each fork call must supply a value.
    per_fork: bool = False
    updated_at: Optional[datetime] = None

    @classmethod
    def from_json(cls, d: Json) -> "Credential":
        return cls(
            name=d.get("name", ""),
            env=d.get("env", ""),
            file=d.get("file", ""),
            per_fork=bool(d.get("perFork", False)),
            updated_at=_time(d.get("updatedAtUnixMs")),
        )


@dataclass
class ForkChild:
    """One child of a fork: a sandbox, or the error that child got."""

    sandbox: Optional["Sandbox"] = None
    error: Optional["ForkboxError"] = None
    start_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.sandbox is not None


@dataclass
class ForkResult:
    """The outcome of ``sb.fork(tag, count=N)``: per-child results."""

    checkpoint: Optional[Checkpoint]
    #: What the children start from: "filesystem" or "filesystem+memory".
    captured: str
    #: How long the source was frozen.
    capture_ms: float
    flush_ms: float
    total_ms: float
    children: List[ForkChild]

    @property
    def sandboxes(self) -> List["Sandbox"]:
        """The children that started."""
        return [c.sandbox for c in self.children if c.sandbox is not None]

    @property
    def errors(self) -> List["ForkboxError"]:
        """The errors of the children that did not."""
        return [c.error for c in self.children if c.error is not None]


@dataclass
class ForkEvent:
    """One event of ``sb.fork_stream()``: ``type`` is "captured" (first:
    ``checkpoint``, ``captured``, ``capture_ms``, ``flush_ms``, ``count``),
    "child" (one per child as it is ready or has failed: ``index``, ``child``)
    or "done" (last: ``total_ms``, ``started``, ``failed``)."""

    type: str
    checkpoint: Optional[Checkpoint] = None
    captured: str = ""
    capture_ms: float = 0.0
    flush_ms: float = 0.0
    count: int = 0
    index: int = 0
    child: Optional[ForkChild] = None
    total_ms: float = 0.0
    started: int = 0
    failed: int = 0


@dataclass
class ReplayedExec:
    exec_id: str
    argv: List[str] = field(default_factory=list)
    shell: str = ""
    skipped: bool = False
    skip_reason: str = ""
    exit_code: int = 0
    error: str = ""

    @classmethod
    def from_json(cls, d: Json) -> "ReplayedExec":
        return cls(
            exec_id=d.get("execId", ""),
            argv=list(d.get("argv") or []),
            shell=d.get("shell", ""),
            skipped=bool(d.get("skipped", False)),
            skip_reason=d.get("skipReason", ""),
            exit_code=_int(d.get("exitCode")),
            error=d.get("error", ""),
        )


@dataclass
class Resumed:
    """What client.resume() did: the checkpoint restored and the execs replayed."""

    checkpoint: Optional[Checkpoint]
    replayed: List[ReplayedExec]


@dataclass
class Handover:
    """How env.sandbox() handed a sandbox over."""

    #: This call built the environment.
    built: bool
    #: The sandbox came from the warm pool.
    from_pool: bool
    handover_ms: float


@dataclass
class Image:
    name: str
    digest: str = ""
    size: int = 0
    layers: int = 0
    created_at: Optional[datetime] = None

    @classmethod
    def from_json(cls, d: Json) -> "Image":
        return cls(
            name=d.get("name", ""),
            digest=d.get("digest", ""),
            size=_int(d.get("size")),
            layers=_int(d.get("layers")),
            created_at=_time(d.get("createdAtUnixMs")),
        )


@dataclass
class ImageProgress:
    phase: str
    done: int = 0
    total: int = 0
    #: Set on the last message.
    image: Optional[Image] = None

    @classmethod
    def from_json(cls, d: Json) -> "ImageProgress":
        img = d.get("image")
        return cls(
            phase=d.get("phase", ""),
            done=_int(d.get("done")),
            total=_int(d.get("total")),
            image=Image.from_json(img) if img else None,
        )


@dataclass
class WriteFile:
    """A setup step that writes a file (strings as UTF-8; mode 0 = 0644)."""

    path: str
    content: Union[str, bytes]
    mode: int = 0


#: A setup step: a shell command, or a file to write.
Step = Union[str, WriteFile]


def step_to_json(s: Union[Step, Mapping[str, Any]]) -> Json:
    if isinstance(s, str):
        return {"run": s}
    if isinstance(s, Mapping):
        s = WriteFile(path=s["path"], content=s["content"], mode=int(s.get("mode", 0)))
    content = s.content.encode("utf-8") if isinstance(s.content, str) else bytes(s.content)
    return {"writePath": s.path, "writeContent": b64encode(content), "writeMode": s.mode}


def _step_from_json(d: Json) -> Step:
    if d.get("writePath"):
        return WriteFile(
            path=d["writePath"],
            content=b64decode(d.get("writeContent")),
            mode=_int(d.get("writeMode")),
        )
    return d.get("run", "")


@dataclass
class EnvironmentDefinition:
    name: str
    image: str
    resources: Resources = field(default_factory=Resources)
    env: Dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    runtime: str = ""
    steps: List[Step] = field(default_factory=list)
    max_age_seconds: int = 0
    pool_size: int = 0
    #: For client-run setups: a hash of the setup code.
    setup_hash: str = ""
    egress: str = ""

    @classmethod
    def from_json(cls, d: Optional[Json]) -> "EnvironmentDefinition":
        d = d or {}
        return cls(
            name=d.get("name", ""),
            image=d.get("image", ""),
            resources=Resources.from_json(d.get("resources")),
            env=dict(d.get("env") or {}),
            cwd=d.get("cwd", ""),
            runtime=d.get("runtime", ""),
            steps=[_step_from_json(s) for s in d.get("steps") or []],
            max_age_seconds=_int(d.get("maxAgeSeconds")),
            pool_size=_int(d.get("poolSize")),
            setup_hash=d.get("setupHash", ""),
            egress=d.get("egress", ""),
        )


@dataclass
class EnvironmentInfo:
    """An environment as the daemon knows it."""

    definition: EnvironmentDefinition
    #: Hash of the definition (image digest, steps, resources, ...).
    hash: str
    #: The warm snapshot (a checkpoint ID); "" until built.
    checkpoint: str = ""
    built_at: Optional[datetime] = None
    build_ms: float = 0.0
    #: "ready", "building", "failed", "new".
    state: str = ""
    error: str = ""
    pool_ready: int = 0
    #: Steps taken from an already-built prefix in the last build.
    cached_steps: int = 0

    @property
    def name(self) -> str:
        return self.definition.name

    @classmethod
    def from_json(cls, d: Json) -> "EnvironmentInfo":
        return cls(
            definition=EnvironmentDefinition.from_json(d.get("definition")),
            hash=d.get("hash", ""),
            checkpoint=d.get("checkpoint", ""),
            built_at=_time(d.get("builtAtUnixMs")),
            build_ms=_float(d.get("buildMs")),
            state=d.get("state", ""),
            error=d.get("error", ""),
            pool_ready=_int(d.get("poolReady")),
            cached_steps=_int(d.get("cachedSteps")),
        )


@dataclass
class BuildProgress:
    """One message of a step build's progress."""

    #: "cached", "create", "step", "checkpoint", "done", "wait".
    phase: str
    step: int = 0
    steps: int = 0
    message: str = ""
    #: Output of a step, as produced.
    output: bytes = b""
    exit_code: int = 0
    #: Set on the last message.
    environment: Optional[EnvironmentInfo] = None

    @classmethod
    def from_json(cls, d: Json) -> "BuildProgress":
        env = d.get("environment")
        return cls(
            phase=d.get("phase", ""),
            step=_int(d.get("step")),
            steps=_int(d.get("steps")),
            message=d.get("message", ""),
            output=b64decode(d.get("output")),
            exit_code=_int(d.get("exitCode")),
            environment=EnvironmentInfo.from_json(env) if env else None,
        )


@dataclass
class BuildResult:
    environment: EnvironmentInfo
    #: This call built it (False: it was built already, or another caller built it).
    built: bool
