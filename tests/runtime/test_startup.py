"""Start-up cost: building a decoder on the meta device (every load does) must not import
torch._dynamo (nn.Embedding's own normal_ init does: ~1.5 s of each decode's start)."""

import subprocess
import sys

CODE = """
import sys, torch
from dustin_runtime.config import ModelConfig
from dustin_runtime.model import Transformer
with torch.device("meta"):
    m = Transformer(ModelConfig("llama", 131, 64, 96, 2, 4, 2, 16, 512, tie_word_embeddings=True))
assert m.embed.weight.shape == (131, 64) and m.lm_head.weight is m.embed.weight
print("torch._dynamo" in sys.modules)
"""


def test_building_a_decoder_does_not_import_dynamo():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
