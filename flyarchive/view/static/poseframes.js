// The poses of the worlds shown in the 3D view, kept in the page frame by frame, so that a
// move of the time cursor draws at once: after a new selection, the frames around the
// cursor are fetched first, then the rest of the recording (as much as `maxBytes` holds),
// in blocks, one block request at a time. A frame asked for before its block arrived is
// fetched alone.

const BLOCK = 100;  // frames per block request (the server takes up to 500)

export class PoseFrames {
  // fetchFrames(worlds, start, count) -> Promise of an array of Float32Array (one per frame).
  constructor(fetchFrames, nFrames, maxBytes = 96 << 20) {
    this.fetchFrames = fetchFrames;
    this.nFrames = nFrames;
    this.maxBytes = maxBytes;
    this.generation = 0;
    this.reset([]);
  }

  // Forget every pose; the next ones are those of `worlds`.
  reset(worlds) {
    this.worlds = worlds;
    this.frames = new Map();  // frame -> Float32Array (worlds, geoms + 1, 12)
    this.generation += 1;
    this.prefetching = false;
  }

  get(frame) { return this.frames.get(frame); }

  // The poses of `frame`: kept, or fetched now (alone).
  async fetch(frame) {
    const kept = this.frames.get(frame);
    if (kept) return kept;
    const generation = this.generation;
    const [poses] = await this.fetchFrames(this.worlds, frame, 1);
    if (generation === this.generation) this.frames.set(frame, poses);
    return poses;
  }

  // Fetch blocks of frames, the cursor's first, then outwards, while the worlds stay the
  // same; at most as many frames as `maxBytes` holds (`frameBytes`: one frame's poses).
  async prefetch(around, frameBytes) {
    if (this.prefetching || !this.worlds.length) return;
    this.prefetching = true;
    const generation = this.generation;
    const most = Math.max(BLOCK, Math.floor(this.maxBytes / Math.max(frameBytes, 1)));
    const first = Math.floor(around / BLOCK);
    const blocks = [];
    for (let d = 0; d * BLOCK < this.nFrames; d++) {
      for (const b of d ? [first + d, first - d] : [first]) {
        if (b >= 0 && b * BLOCK < this.nFrames && Math.abs(b - first) * BLOCK < most / 2 + BLOCK) blocks.push(b);
      }
    }
    try {
      for (const b of blocks) {
        if (generation !== this.generation) return;
        const start = b * BLOCK, count = Math.min(BLOCK, this.nFrames - start);
        let missing = false;
        for (let f = start; f < start + count && !missing; f++) missing = !this.frames.has(f);
        if (!missing) continue;
        const frames = await this.fetchFrames(this.worlds, start, count);
        if (generation !== this.generation) return;
        frames.forEach((poses, i) => this.frames.set(start + i, poses));
      }
    } finally {
      if (generation === this.generation) this.prefetching = false;
    }
  }
}
