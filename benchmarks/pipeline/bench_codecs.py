"""Decode speed per codec and decoder backend (libsndfile vs FFmpeg through PyAV), issue 35.

    .venv/bin/python -m benchmarks.pipeline.bench_codecs [--clips 6] [--seconds 10] [--repeats 5] [--out FILE.json]

Encodes ``--clips`` distinct clips of ``--seconds`` per codec with PyAV (WAV PCM16, FLAC, MP3 128 kb/s, Opus
96 kb/s in Ogg, AAC 128 kb/s in M4A) at two settings: 16 kHz mono (speech) and 44.1 kHz stereo (music, AudioSet;
Opus at 48 kHz, its own rate), then measures, on one thread, per clip:

* **decode**: `load_clip` of the whole clip at its own rate (decode + mix down, no resampling, no crop);
* **crop**: `load_clip` of a 5 s crop at 16 kHz, as the loader does it (the window alone where the backend can
  seek exactly: both backends for WAV and FLAC; the rest is decoded whole).

Each backend that can read the codec runs; AAC is FFmpeg only (libsndfile cannot open MP4). The variants run
interleaved, ``--repeats`` rounds, and the table shows median ms per clip and the median per-round ratio
FFmpeg / libsndfile (below 1: FFmpeg faster): the machine is shared, so only the ratios of one run compare.
Then each backend decodes every clip once in a fresh process: the time to its first decoded clip (imports,
PyAV's FFmpeg libraries loading) and its peak RSS (one process, no workers: the process tree is that process).
Also whether the two backends give the same samples.

``--raw``: only the two decoders themselves on FLAC and MP3 (``soundfile.read`` against a bare PyAV loop, no
conversion, mix down or crop): whether FFmpeg's decoder is faster than libsndfile's here, apart from our path.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import statistics
import time
from collections import defaultdict

import numpy as np

from benchmarks.common import av_encode

#: name -> (container, encoder, bit rate); the decoder backends that read it.
CODECS = {
    "WAV": ("wav", "pcm_s16le", None),
    "FLAC": ("flac", "flac", None),
    "MP3": ("mp3", "libmp3lame", 128_000),
    "Opus": ("ogg", "libopus", 96_000),
    "AAC": ("ipod", "aac", 128_000),
}
BACKENDS = {"AAC": ("ffmpeg",)}
SETTINGS = [(16000, 1), (44100, 2)]


def make_clips(n: int, seconds: float, rate: int, channels: int, codec: str) -> tuple[list[bytes], int]:
    container, encoder, bit_rate = CODECS[codec]
    if codec == "Opus" and rate == 44100:
        rate = 48000  # Opus has no 44.1 kHz
    rng = np.random.default_rng(rate + channels)
    t = np.arange(int(seconds * rate)) / rate
    clips = []
    for i in range(n):
        tone = 0.3 * np.sin(2 * np.pi * (220 + 50 * i) * t) * (1 + 0.5 * np.sin(2 * np.pi * 0.5 * t))
        signal = np.stack([tone + 0.05 * rng.standard_normal(len(t)) for _ in range(channels)], axis=1)
        clips.append(av_encode(signal.astype(np.float32), rate, container, encoder, bit_rate))
    return clips, rate


def decode_all(data: bytes, rate: int, backend: str) -> np.ndarray:
    from audioloader.dsp.audio import load_clip

    return load_clip(data, rate, None, train=False, draw=lambda n: 0, backend=backend)


def crop(data: bytes, backend: str, index: int) -> np.ndarray:
    from audioloader.dsp.audio import load_clip

    return load_clip(data, 16000, 80000, train=True, draw=lambda n: (index * 7919) % n, backend=backend)


def raw_decoders(data: bytes) -> dict[str, float]:
    """Seconds of the two decoders alone on one clip, without the loader's path around them: ``soundfile.read``
    to float32, and a bare PyAV loop (open, demux, decode; the frames left as FFmpeg gives them)."""
    import av
    import soundfile as sf

    start = time.perf_counter()
    sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    middle = time.perf_counter()
    with av.open(io.BytesIO(data), options={"probesize": "4096"}) as container:
        for packet in container.demux(container.streams.audio[0]):
            packet.decode()
    return {"sndfile": middle - start, "ffmpeg": time.perf_counter() - middle}


def raw_table(args: argparse.Namespace) -> list[dict]:
    """FLAC (and MP3) through the bare decoders, interleaved, ``--repeats`` rounds over every clip."""
    rows = []
    print("| codec | rate, channels | libsndfile ms/clip | FFmpeg (bare PyAV loop) ms/clip | ratio FFmpeg/libsndfile |")
    print("|---|---|---|---|---|")
    for rate, channels in SETTINGS:
        for codec in ("FLAC", "MP3"):
            clips, clip_rate = make_clips(args.clips, args.seconds, rate, channels, codec)
            rounds = []
            for _ in range(args.repeats):
                seconds = [raw_decoders(data) for data in clips]
                rounds.append({k: sum(s[k] for s in seconds) / len(clips) for k in ("sndfile", "ffmpeg")})
            sndfile = statistics.median(r["sndfile"] for r in rounds)
            ffmpeg = statistics.median(r["ffmpeg"] for r in rounds)
            ratio = statistics.median(r["ffmpeg"] / r["sndfile"] for r in rounds)
            rows.append({"codec": codec, "rate": clip_rate, "channels": channels, "sndfile_ms": 1000 * sndfile,
                         "ffmpeg_ms": 1000 * ffmpeg, "ratio": ratio})
            print(f"| {codec} | {clip_rate / 1000:g} kHz, {channels} | {1000 * sndfile:.2f} | {1000 * ffmpeg:.2f} | "
                  f"{ratio:.2f} |", flush=True)
    return rows


def timed_rounds(clips: list[bytes], rate: int, backends: tuple[str, ...], repeats: int) -> dict[str, list[float]]:
    """Median seconds per clip, per (stage, backend), each round interleaving the backends."""
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeats):
        for backend in backends:
            for stage, run in (("decode", lambda c, b, i: decode_all(c, rate, b)), ("crop", crop)):
                start = time.perf_counter()
                for i, data in enumerate(clips):
                    run(data, backend, i)
                times[f"{stage}/{backend}"].append((time.perf_counter() - start) / len(clips))
    return times


def _child(clips: list[bytes], rate: int, backend: str, queue: multiprocessing.Queue) -> None:
    start = time.perf_counter()
    decode_all(clips[0], rate, backend)
    first = time.perf_counter() - start
    for data in clips[1:]:
        decode_all(data, rate, backend)
    queue.put((first, peak_rss_mib()))


def peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM; ``ru_maxrss`` would keep the forking parent's across exec)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def fresh_process(clips: list[bytes], rate: int, backend: str) -> tuple[float, float]:
    """(seconds to the first decoded clip, peak RSS MiB) of a fresh process decoding every clip once."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(clips, rate, backend, queue))
    process.start()
    result = queue.get(timeout=600)
    process.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="write the results as JSON here too")
    parser.add_argument("--raw", action="store_true", help="only the bare decoders on FLAC and MP3 (no loader path)")
    args = parser.parse_args()
    if args.raw:
        rows = raw_table(args)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"args": vars(args), "raw": rows}, f, indent=1)
        return
    rows = []
    header = ("| codec | rate, channels | backend | decode ms/clip | x realtime | crop ms/clip | decode ratio "
              "FFmpeg/sndfile | crop ratio | first clip ms (fresh process) | peak RSS MiB | same samples |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for rate, channels in SETTINGS:
        for codec in CODECS:
            clips, clip_rate = make_clips(args.clips, args.seconds, rate, channels, codec)
            backends = BACKENDS.get(codec, ("sndfile", "ffmpeg"))
            times = timed_rounds(clips, clip_rate, backends, args.repeats)
            same = None
            if len(backends) == 2:
                same = all(np.array_equal(decode_all(c, clip_rate, "sndfile"), decode_all(c, clip_rate, "ffmpeg"))
                           for c in clips)
            for backend in backends:
                decode = statistics.median(times[f"decode/{backend}"])
                crop_s = statistics.median(times[f"crop/{backend}"])
                ratios = {}
                if len(backends) == 2:
                    for stage in ("decode", "crop"):
                        ratios[stage] = statistics.median(f / s for f, s in zip(times[f"{stage}/ffmpeg"],
                                                                                 times[f"{stage}/sndfile"],
                                                                                 strict=True))
                first, rss = fresh_process(clips, clip_rate, backend)
                row = {"codec": codec, "rate": clip_rate, "channels": channels, "backend": backend,
                       "decode_ms": 1000 * decode, "realtime": args.seconds / decode, "crop_ms": 1000 * crop_s,
                       "decode_ratio": ratios.get("decode"), "crop_ratio": ratios.get("crop"),
                       "first_ms": 1000 * first, "peak_rss_mib": rss, "same_samples": same}
                rows.append(row)
                show = "" if backend == "sndfile" or not ratios else f"{ratios['decode']:.2f}"
                show_crop = "" if backend == "sndfile" or not ratios else f"{ratios['crop']:.2f}"
                print(f"| {codec} | {clip_rate // 1000 if clip_rate % 1000 == 0 else clip_rate / 1000} kHz, "
                      f"{channels} | {backend} | {1000 * decode:.2f} | {args.seconds / decode:.0f} | "
                      f"{1000 * crop_s:.2f} | {show} | {show_crop} | {1000 * first:.0f} | {rss:.0f} | "
                      f"{'' if same is None else ('yes' if same else 'no')} |", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
