"""routerd.sim: the inference simulator behind ``routerd-sim FAMILY [flags]``.

A stand-in for llama-server, sd-server, whisper-server, KoboldCpp and vLLM in tests and on the demo
node; each backend family names the simulator of each of its programs in its declaration
(:mod:`routerd.families`); each simulating module exposes its program as ``PROGRAM``, which
``routerd.sim.families`` finds. Helpers other modules import: ``routerd.sim.weights.write_weights``
(weight files), ``routerd.sim.wav.make_wav`` / ``wav_duration`` (WAV clips),
``routerd.sim.multipart`` (form bodies) and ``routerd.sim.harness.SimHarness`` (a simulated backend
driven in-process). This package module imports nothing heavy, so ``routerd.sim.wav`` stays cheap to
import.
"""
