// One import for a page: the protocol client and the player.
export { Voxwire, Utterance, VoxwireError, defaultUrl, MIN_SAMPLE_RATE, MAX_SAMPLE_RATE } from './voxwire.js';
export { Player } from './player.js';
