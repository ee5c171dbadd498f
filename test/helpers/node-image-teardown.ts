import { removeNodeImages } from './node-image.js';

/** The run's node images go at its end, whichever of the files that use them ran. */
export default function setup(): () => Promise<void> {
  return removeNodeImages;
}
