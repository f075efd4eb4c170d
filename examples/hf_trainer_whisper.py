"""Fine-tune a (tiny, randomly initialised) Whisper with the Hugging Face ``Seq2SeqTrainer`` and resume it exactly.

    pip install transformers
    python examples/hf_trainer_whisper.py            # synthetic data in a temporary folder
    python examples/hf_trainer_whisper.py --quick    # a tiny run (seconds of training), as the tests run it

What it shows (docs/integrations.md, "Hugging Face Trainer"):

* the features Whisper expects, from the loader: 16 kHz audio, a 400-sample Hann window every 160 samples,
  80 mel bands; ``to_inputs`` applies Whisper's own scaling (log10, a floor 8 below the clip's peak,
  ``(x + 4) / 4``) and drops the last frame, as ``WhisperFeatureExtractor`` does. Clips are cropped to
  2 s here (``max_source_positions=100``) to keep the model small; a real Whisper takes 30 s (3000 frames);
* text labels tokenised by a character tokenizer built in code (the ``tokenizers`` library), padded with
  -100 where the loss should not look;
* `AudioLoaderSeq2SeqTrainer`: the loaders instead of datasets, ``max_steps`` (the training loader is
  endless), gradient accumulation, checkpoints every ``--save-every`` steps, an evaluation every
  ``--eval-every``;
* ``trainer.train(resume_from_checkpoint=...)``: a new model, Trainer and loader resume from the first
  checkpoint, and train on the same batches, bit for bit, ending with the same weights.

Nothing is downloaded: the model is built from a ``WhisperConfig``, the tokenizer from a list of characters,
the audio is `audioloader.tools.synthetic` (the "transcript" of a clip is its sound's name).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    PreTrainedTokenizerFast,
    Seq2SeqTrainingArguments,
    WhisperConfig,
    WhisperForConditionalGeneration,
)

import audioloader as al
from audioloader.integrations.transformers import AudioLoaderSeq2SeqTrainer
from audioloader.tools.synthetic import make_classification_dataset

SECONDS = 2.0
#: Whisper's front end: 16 kHz, 25 ms Hann window, 10 ms hop, 80 mel bands (a floor of 1e-10 before the log).
FEATURES = al.MelSpectrogramConfig(sample_rate=16000, clip_seconds=SECONDS, n_fft=400, hop_length=160, n_mels=80,
                                   log_offset=1e-10)
FRAMES = round(SECONDS * 100)  # 1 + samples // hop frames; Whisper drops the last one
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]


def char_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """A character tokenizer over the characters of ``texts``, ending each sequence with ``</s>``."""
    vocab = {token: i for i, token in enumerate(SPECIALS + sorted(set("".join(texts))))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")  # every character a token
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", vocab["</s>"])])
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def tiny_whisper(tokenizer: PreTrainedTokenizerFast) -> WhisperForConditionalGeneration:
    config = WhisperConfig(vocab_size=len(tokenizer), num_mel_bins=FEATURES.n_mels, d_model=64, encoder_layers=2,
                           decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
                           encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=FRAMES // 2,
                           max_target_positions=32, pad_token_id=tokenizer.pad_token_id,
                           bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                           decoder_start_token_id=tokenizer.bos_token_id, suppress_tokens=[],
                           begin_suppress_tokens=None)
    return WhisperForConditionalGeneration(config)


def whisper_scaling(log_mel: torch.Tensor) -> torch.Tensor:
    """The loader's natural-log mel power ``[B, 80, frames + 1]`` as ``WhisperFeatureExtractor`` scales it."""
    x = log_mel[..., :FRAMES] / math.log(10.0)
    x = torch.maximum(x, x.amax(dim=(-2, -1), keepdim=True) - 8.0)
    return (x + 4.0) / 4.0


def inputs_for(tokenizer: PreTrainedTokenizerFast, names: dict[int, str]):
    """``to_inputs``: a loader batch -> Whisper's ``input_features`` and ``labels``."""
    def to_inputs(batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        texts = [names[int(label)] for label in batch["label"]]
        tokens = tokenizer(texts, padding=True, return_tensors="pt")
        labels = tokens["input_ids"].masked_fill(tokens["attention_mask"] == 0, -100)
        if "valid" in batch:  # evaluation on several ranks: padding rows count in no loss
            labels[~batch["valid"]] = -100
        return {"input_features": whisper_scaling(batch["spectrogram"]), "labels": labels}

    return to_inputs


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def train(args: argparse.Namespace, data: Path, output: Path, resume: Path | None = None) -> tuple[list[str], str]:
    """One ``trainer.train()`` (from ``resume`` if given): the digests of the batches trained on, and of the weights."""
    names = {i: name for name, i in json.loads((data / "train" / "labels.json").read_text()).items()}
    tokenizer = char_tokenizer(list(names.values()))
    torch.manual_seed(args.seed)
    model = tiny_whisper(tokenizer)
    trained: list[str] = []
    model.register_forward_pre_hook(
        lambda module, _, kwargs: trained.append(digest(kwargs["input_features"])) if module.training else None,
        with_kwargs=True)
    training = Seq2SeqTrainingArguments(
        output, max_steps=args.steps, gradient_accumulation_steps=args.accumulation, save_steps=args.save_every,
        eval_strategy="steps", eval_steps=args.eval_every, logging_steps=args.eval_every, learning_rate=1e-3,
        per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=args.batch_size, report_to="none",
        use_cpu=not torch.cuda.is_available(), disable_tqdm=True, seed=args.seed)
    # The loaders after the TrainingArguments: under torchrun they take their rank from its process group.
    train_loader = al.AudioLoader(data / "train", batch_size=args.batch_size, seed=args.seed, features=FEATURES,
                                  shuffle=al.Shuffle(buffer_size=64, min_size=16),
                                  workers=al.Workers(num_workers=args.workers, kind=args.worker_kind))
    eval_loader = al.AudioLoader(data / "eval", batch_size=args.batch_size, train=False, features=FEATURES,
                                 workers=al.Workers(num_workers=args.workers, kind=args.worker_kind))
    trainer = AudioLoaderSeq2SeqTrainer(model=model, args=training, train_loader=train_loader,
                                        eval_loader=eval_loader, to_inputs=inputs_for(tokenizer, names),
                                        processing_class=tokenizer)
    with train_loader, eval_loader:
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    losses = [entry["eval_loss"] for entry in trainer.state.log_history if "eval_loss" in entry]
    print(f"  evaluation losses: {', '.join(f'{loss:.3f}' for loss in losses)}")
    return trained, digest(torch.cat([p.detach().flatten() for p in model.parameters()]))


def main(argv: list[str] | None = None) -> bool:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="folder with train/ and eval/ shards and their labels.json, as "
                        "audioloader.tools.synthetic writes them (default: a synthetic dataset)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--accumulation", type=int, default=2, help="gradient accumulation steps")
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--clips-per-class", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a tiny run: 6 steps of 2 batches of 4 clips")
    args = parser.parse_args(argv)
    args.worker_kind = "auto"
    if args.quick:  # one decode thread: no worker process to start for each of the runs' loaders
        args.steps, args.save_every, args.eval_every, args.batch_size = 6, 2, 3, 4
        args.clips_per_class, args.workers, args.worker_kind = 3, 1, "thread"

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        data = args.data or root / "data"
        if args.data is None:
            make_classification_dataset(data / "train", args.clips_per_class, seed=args.seed, num_classes=4,
                                        num_shards=2, min_seconds=0.5, max_seconds=3.0)
            make_classification_dataset(data / "eval", 2, seed=args.seed, num_classes=4, num_shards=1,
                                        min_seconds=0.5, max_seconds=3.0, first_clip=args.clips_per_class)
        print(f"uninterrupted: {args.steps} steps of {args.accumulation} batches")
        whole, weights = train(args, data, root / "uninterrupted")
        step = args.save_every
        print(f"resumed from checkpoint-{step}")
        resumed, resumed_weights = train(args, data, root / "resumed",
                                         resume=root / "uninterrupted" / f"checkpoint-{step}")
        same = resumed == whole[step * args.accumulation:]
        print(f"resumed from checkpoint-{step}: {len(resumed)} batches, identical to the uninterrupted run: {same}")
        print(f"final weights identical: {resumed_weights == weights}")
    return same and resumed_weights == weights


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
