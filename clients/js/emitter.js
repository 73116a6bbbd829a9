// The smallest event emitter that works the same in browsers and Node.

export class Emitter {
  #listeners = new Map();

  /** Call `fn` for every `type` event; returns this, so calls chain. */
  on(type, fn) {
    if (!this.#listeners.has(type)) this.#listeners.set(type, new Set());
    this.#listeners.get(type).add(fn);
    return this;
  }

  off(type, fn) {
    this.#listeners.get(type)?.delete(fn);
    return this;
  }

  emit(type, value) {
    for (const fn of [...(this.#listeners.get(type) ?? [])]) {
      // One listener's bug must not stop the stream for the others: report it, go on.
      try { fn(value); } catch (e) { setTimeout(() => { throw e; }); }
    }
  }
}
