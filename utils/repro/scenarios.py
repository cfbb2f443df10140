"""What is run: the settings of every run, the scenarios (each a reference run and a candidate run), the dataset."""

import os


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS_FILE = os.path.join(REPO_ROOT, "utils", "data", "prompts.txt")
VARIANTS = ("stock", "fork")

SEQUENCE_LENGTH = 32
BATCH_SIZE = 4
LEARNING_RATE = 1e-5
LR_SCHEDULER = "cosine"
OPTIM = "adamw_torch_fused"  # the Trainer's default optimizer: every run but fused_skip's reference
SEED = 0
INITIALIZER_RANGE = (
    1.0  # large enough for fp16 gradients to overflow at a loss scale of 65536 (see the package's docstring)
)

# name -> (title, reference run, candidate run, short labels for both)
SCENARIOS = {
    "exact_resume": (
        "exact resume from checkpoint-{r}",
        "uninterrupted",
        "exact_resume",
        ("uninterrupted", "resumed"),
    ),
    "no_scaler_pt": (
        "resume from checkpoint-{r} without scaler.pt (legacy checkpoint)",
        "uninterrupted",
        "no_scaler_pt",
        ("uninterrupted", "resumed"),
    ),
    "bf16_resume": (
        "resume the fp16 checkpoint-{r} with bf16",
        "uninterrupted",
        "bf16_resume",
        ("uninterrupted fp16", "resumed bf16"),
    ),
    "fused_skip": (
        "overflows forced at steps {o}: adamw_torch vs adamw_torch_fused",
        "fused_skip/adamw_torch",
        "fused_skip/adamw_torch_fused",
        ("adamw_torch", "adamw_torch_fused"),
    ),
    "ddp_exact_resume": (
        "2 processes (DDP): exact resume from checkpoint-{r}",
        "ddp/uninterrupted",
        "ddp/exact_resume",
        ("uninterrupted", "resumed"),
    ),
}
RESUME_SCENARIOS = ("exact_resume", "no_scaler_pt", "bf16_resume")
DDP_SCENARIOS = ("ddp_exact_resume",)


def encode(text: str, length: int = SEQUENCE_LENGTH) -> tuple[list[int], list[int]]:
    """Byte-level tokenizer: UTF-8 bytes shifted by one (0 is padding), truncated or padded to `length`."""
    ids = [byte + 1 for byte in text.encode("utf-8")][:length]
    mask = [1] * len(ids) + [0] * (length - len(ids))
    return ids + [0] * (length - len(ids)), mask


def load_prompts(path: str = PROMPTS_FILE) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def make_dataset(prompts: list[str]) -> list[dict]:
    """Returns the training examples: input_ids, attention_mask and labels (-100 on padding) as tensors."""
    import torch

    examples = []
    for prompt in prompts:
        ids, mask = encode(prompt)
        labels = [token if keep else -100 for token, keep in zip(ids, mask)]
        examples.append(
            {
                "input_ids": torch.tensor(ids),
                "attention_mask": torch.tensor(mask),
                "labels": torch.tensor(labels),
            }
        )
    return examples
