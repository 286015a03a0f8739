// The forkbox TypeScript SDK: sandboxes, exec, forks, checkpoints, restore and
// resume, credentials and environments, over the daemon's Connect API.
export { Client, DEFAULT_SOCKET, FULL_PAGE } from "./client.js";
export type { ClientOptions, ListOptions, SandboxPage, Resources, SandboxOptions, Overrides } from "./client.js";
export { SandboxHandle, Credentials } from "./sandbox.js";
export type { ForkOptions, ForkResult, ForkChild, ForkStreamEvent, CredentialOptions, PortURL } from "./sandbox.js";
export { ExecPromise, DEFAULT_MAX_OUTPUT_BYTES } from "./exec.js";
export type { ExecOptions, ExecResult } from "./exec.js";
export { PtyHandle, Ptys } from "./pty.js";
export type { PtyOptions, PtyResult } from "./pty.js";
export { Environment } from "./environment.js";
export type { EnvironmentOptions, Step, SetupFunction, StartCommand } from "./environment.js";
export {
  ForkboxError, ExecError, isForkboxError, isExecError, isNotFound, isInvalidArgument, isAlreadyExists,
  isFailedPrecondition, isResourceExhausted, isUnavailable, isNotImplemented, isPermissionDenied,
} from "./errors.js";
export type { ErrorCode } from "./errors.js";
export type {
  SandboxInfo, SandboxMetrics, Checkpoint, Credential, Event, FileInfo, Image, ImageProgress, ReplayedExec,
  EnvironmentInfo, EnvironmentDefinition, SetupStepInfo, BuildProgress,
} from "./types.js";
