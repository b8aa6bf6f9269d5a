r"""E8 — Muon vs AdamW on a transformer language model (the orthogonality notes' claim).

    python -m experiments.lm --config=experiments/configs/lm.py[:ARG] --arms=... --workdir=...

(``experiments/flags/lm*.flags`` hold those lines.) A :class:`~orthojax.models.TransformerLM`
on characters of Shakespeare's complete works (:mod:`orthojax.train.data.text`). The
experiment sets per run the arm's ``optimizer`` groups, ``model.stiefel`` and ``penalty``
(``--arms``), their rates (the probe's, or the config's), and ``seed``; those keys are
not set here.

The argument is one of:

* ``""`` — nanoGPT's CPU recipe (Karpathy's ``shakespeare_char`` README): 4 blocks × 128
  wide, 4 heads, context 64, batch 12, 2,000 steps (1.54 M tokens), linear warmup for 100
  steps then cosine, gradients clipped at norm 1, float32. nanoGPT reaches a validation
  loss of about 1.88 on tiny Shakespeare with it; the complete works are a different
  (five times larger) text, so that figure is a scale, not a target;
* ``smoke`` — 2 × 32, context 32, batch 8, 40 steps (CI);
* ``medium`` — the second size, for a GPU: 6 × 256, 4 heads, context 256, batch 32, 500
  steps (4.1 M tokens, 0.9 of an epoch of the complete works' 4.5 M training characters,
  so no window is seen twice on average), warmup 50, evaluated every 50 steps.

Every arm at weight decay 0 (short runs; arXiv 2509.02046 finds the decay's effect in
long ones), AdamW's ``b2 = 0.95`` for every AdamW group (nanoGPT's GPT-2 setting, also
Muon's AdamW group in Keller Jordan's runs).

Production sizes (the experiment's ``--preset``): :data:`PRESETS` names a model, its context and
global batch, for ``--compile_for`` rows: ``gpt2_small`` (12 × 768, 12 heads, context
1024, GPT-2's vocabulary of 50,257 tokens, 512 sequences = 0.52 M tokens a step) and
``gpt_1p3b`` (24 × 2048, 16 heads, context 2048, 256 sequences = 0.52 M tokens; the size of
GPT-3 XL, Brown et al. 2020, Table 2.1).
"""

from experiments.configs._base import data as data_section
from experiments.configs._base import section
from experiments.configs._base import trainer

SCALES = ("smoke", "medium")

PRESETS = {
    "gpt2_small": {"depth": 12, "width": 768, "heads": 12, "context": 1024,
                   "vocab_size": 50257, "batch_size": 512},
    "gpt_1p3b": {"depth": 24, "width": 2048, "heads": 16, "context": 2048,
                 "vocab_size": 50257, "batch_size": 256},
}
"""Production sizes for the compile rows: the model, its context, vocabulary and global
batch (sequences)."""


def get_config(arg: str = ""):
  if arg not in ("",) + SCALES:
    raise ValueError(f"lm.py:{arg}: unknown argument; use one of {', '.join(SCALES)} or none")
  model = section("model", "TransformerLM", depth=4, width=128, heads=4, mlp_ratio=4,
                  activation="gelu", qk_norm=False, scale="output")
  data = data_section("shakespeare", context=64, eval_windows=400)
  for keys, per_run in ((model, ("stiefel", "oblique")), (data, ("eval_split",))):
    for key in per_run:   # set by the experiment per arm / per stage
      del keys[key]
  config = trainer(
      model=model, data=data,
      batch_size=12, eval_batch_size=100, num_steps=2000,
      loss="cross_entropy",
      optimizer={"euclidean": section("optimizer", "adamw", learning_rate=1e-3, b2=0.95,
                                      weight_decay=0.0)},
      schedule="warmup_cosine", warmup_steps=100, grad_clip_norm=1.0,
      log_every=50, eval_every=200, checkpoint={"every_steps": 500, "keep": 2})
  if arg == "smoke":
    config.model.depth, config.model.width, config.model.heads = 2, 32, 2
    config.data.context, config.data.eval_windows = 32, 64
    config.batch_size, config.eval_batch_size, config.num_steps = 8, 32, 40
    config.warmup_steps, config.log_every, config.eval_every = 5, 10, 10
    config.checkpoint.every_steps = 20
  if arg == "medium":
    config.model.depth, config.model.width, config.model.heads = 6, 256, 4
    config.data.context = 256
    config.batch_size, config.num_steps = 32, 500
    config.warmup_steps, config.log_every, config.eval_every = 50, 25, 50
    config.checkpoint.every_steps = 250
  return config
