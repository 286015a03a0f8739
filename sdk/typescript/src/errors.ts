// Errors of the forkbox SDK. Every error the daemon returns becomes a
// ForkboxError whose `code` is the error class the daemon gave it (the same
// class names as the Go SDK's errdefs), so callers test the class, never the
// message. A command that ran but exited non-zero is an ExecError.
import { Code, ConnectError } from "@connectrpc/connect";
import type { ExecResult } from "./exec.js";

/** The error classes of forkbox. */
export type ErrorCode =
  | "InvalidArgument"
  | "NotFound"
  | "AlreadyExists"
  | "FailedPrecondition"
  | "Unavailable"
  | "ResourceExhausted"
  | "PermissionDenied"
  | "Unauthenticated"
  | "DeadlineExceeded"
  | "Canceled"
  | "NotImplemented"
  | "Internal"
  | "Unknown";

const fromCode: Record<number, ErrorCode> = {
  [Code.Canceled]: "Canceled",
  [Code.Unknown]: "Unknown",
  [Code.InvalidArgument]: "InvalidArgument",
  [Code.DeadlineExceeded]: "DeadlineExceeded",
  [Code.NotFound]: "NotFound",
  [Code.AlreadyExists]: "AlreadyExists",
  [Code.PermissionDenied]: "PermissionDenied",
  [Code.ResourceExhausted]: "ResourceExhausted",
  [Code.FailedPrecondition]: "FailedPrecondition",
  [Code.Unimplemented]: "NotImplemented",
  [Code.Internal]: "Internal",
  [Code.Unavailable]: "Unavailable",
  [Code.Unauthenticated]: "Unauthenticated",
};

const unreachable = new Set(["ENOENT", "ECONNREFUSED", "ECONNRESET", "EPIPE", "EHOSTUNREACH", "ETIMEDOUT"]);

const codes = new Set<string>(Object.values(fromCode));

/** An error of one of forkbox's classes, as the daemon (or this SDK) gave it. */
export class ForkboxError extends Error {
  override readonly name = "ForkboxError";
  /** The error class: "NotFound", "InvalidArgument", ... */
  readonly code: ErrorCode;

  constructor(code: ErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
  }

  /** What JSON.stringify(err) gives (an Error's message is not an own enumerable field). */
  toJSON(): { name: string; code: ErrorCode; message: string } {
    return { name: this.name, code: this.code, message: this.message };
  }

  /** Builds an error from a class name as the daemon spells it (ForkChild.error_class). */
  static fromClassName(name: string, message: string): ForkboxError {
    return new ForkboxError(codes.has(name) ? (name as ErrorCode) : "Unknown", message);
  }

  /** Converts any error thrown by the Connect client into a ForkboxError. */
  static from(err: unknown): ForkboxError {
    if (err instanceof ForkboxError) return err;
    if (err instanceof ConnectError) {
      // The daemon could not be reached: connect-node reports it as Internal
      // with the socket error as the cause.
      const sys = (err.cause as { code?: unknown } | undefined)?.code;
      if (sys === "EACCES") {
        // The socket exists but this process may not connect to it: not a
        // daemon outage, and retrying will not help.
        return new ForkboxError("PermissionDenied", `permission denied connecting to the forkbox daemon: ${err.rawMessage}`, { cause: err });
      }
      if (typeof sys === "string" && unreachable.has(sys)) {
        return new ForkboxError("Unavailable", `forkbox daemon unreachable: ${err.rawMessage}`, { cause: err });
      }
      return new ForkboxError(fromCode[err.code] ?? "Unknown", err.rawMessage, { cause: err });
    }
    if (err instanceof Error && err.name === "AbortError") {
      return new ForkboxError("Canceled", err.message, { cause: err });
    }
    const msg = err instanceof Error ? err.message : String(err);
    return new ForkboxError("Unknown", msg, { cause: err });
  }
}

/**
 * A command that ran to its end but did not succeed: non-zero exit, killed by
 * a signal, timed out or OOM-killed. Like child_process, exec() rejects with it
 * unless called with `{ nothrow: true }`; `result` holds the full outcome.
 */
export class ExecError extends Error {
  override readonly name = "ExecError";
  readonly result: ExecResult;
  readonly exitCode: number;

  constructor(command: string, result: ExecResult) {
    const why = result.timedOut
      ? "timed out"
      : result.oomKilled
        ? "was killed: out of memory"
        : result.signal
          ? `was killed by ${result.signal}`
          : `exited with code ${result.exitCode}`;
    const tail = result.stderr.trim().split("\n").slice(-5).join("\n");
    super(`command ${JSON.stringify(command)} ${why}${tail ? `: ${tail}` : ""}`);
    this.result = result;
    this.exitCode = result.exitCode;
  }

  /** What JSON.stringify(err) gives. */
  toJSON(): { name: string; message: string; exitCode: number; result: ExecResult } {
    return { name: this.name, message: this.message, exitCode: this.exitCode, result: this.result };
  }
}

/** Converts a rejected Connect call into a ForkboxError (rethrows it). */
export function rethrow(err: unknown): never {
  throw ForkboxError.from(err);
}

export const isForkboxError = (e: unknown): e is ForkboxError => e instanceof ForkboxError;
export const isExecError = (e: unknown): e is ExecError => e instanceof ExecError;
const is = (code: ErrorCode) => (e: unknown): e is ForkboxError => e instanceof ForkboxError && e.code === code;
export const isNotFound = is("NotFound");
export const isInvalidArgument = is("InvalidArgument");
export const isAlreadyExists = is("AlreadyExists");
export const isFailedPrecondition = is("FailedPrecondition");
export const isResourceExhausted = is("ResourceExhausted");
export const isUnavailable = is("Unavailable");
export const isPermissionDenied = is("PermissionDenied");
export const isNotImplemented = is("NotImplemented");
