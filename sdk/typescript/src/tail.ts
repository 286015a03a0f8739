// tail: the bounded memory of one exec output stream. It keeps the last
// `max` bytes written to it (whole chunks where it can, the first kept chunk
// cut at the front) and remembers whether anything was dropped.

/** One chunk of output, numbered in arrival order across both streams. */
export interface Chunk {
  seq: number;
  data: Uint8Array;
}

/** The last `max` bytes of a stream. */
export class TailBuffer {
  private chunks: Chunk[] = [];
  private head = 0; // index of the first kept chunk in `chunks`
  private size = 0; // bytes kept
  /** Whether bytes were dropped (more than `max` were written). */
  truncated = false;

  constructor(private readonly max: number) {}

  push(seq: number, data: Uint8Array): void {
    if (data.length === 0) return;
    if (data.length >= this.max) {
      // This chunk alone fills the buffer: keep its tail, drop the rest.
      this.truncated ||= data.length > this.max || this.size > 0;
      this.chunks = this.max > 0 ? [{ seq, data: data.slice(data.length - this.max) }] : [];
      this.head = 0;
      this.size = this.max;
      return;
    }
    this.chunks.push({ seq, data });
    this.size += data.length;
    while (this.size > this.max) {
      const first = this.chunks[this.head]!;
      const excess = this.size - this.max;
      this.truncated = true;
      if (first.data.length <= excess) {
        this.size -= first.data.length;
        this.chunks[this.head++] = undefined as unknown as Chunk; // release it now
      } else {
        // Copy, so the dropped front of the chunk is not kept alive by a view.
        first.data = first.data.slice(excess);
        this.size -= excess;
      }
    }
    // Compact now and then so dropped slots do not pile up.
    if (this.head > 1024 && this.head * 2 > this.chunks.length) {
      this.chunks = this.chunks.slice(this.head);
      this.head = 0;
    }
  }

  /** The kept chunks, oldest first. */
  kept(): Chunk[] {
    return this.chunks.slice(this.head);
  }

  /**
   * The kept bytes as UTF-8 text. When the front was dropped, UTF-8
   * continuation bytes at the start (the rest of a character cut in two) are
   * skipped, so the text does not start with a replacement character.
   */
  text(): string {
    let b = Buffer.concat(this.kept().map((c) => c.data));
    if (this.truncated) {
      let i = 0;
      while (i < 3 && i < b.length && (b[i]! & 0xc0) === 0x80) i++;
      b = b.subarray(i);
    }
    return b.toString("utf8");
  }
}

/** Merges two streams' kept chunks back into arrival order. */
export function merged<K extends string>(a: [K, Chunk[]], b: [K, Chunk[]]): { stream: K; data: Uint8Array }[] {
  const out: { stream: K; data: Uint8Array }[] = [];
  let i = 0;
  let j = 0;
  const [ka, ca] = a;
  const [kb, cb] = b;
  while (i < ca.length || j < cb.length) {
    if (j >= cb.length || (i < ca.length && ca[i]!.seq < cb[j]!.seq)) out.push({ stream: ka, data: ca[i++]!.data });
    else out.push({ stream: kb, data: cb[j++]!.data });
  }
  return out;
}
