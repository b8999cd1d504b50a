"""``ckptlab.profile``: the engine on a model defined in the caller's code, stored so that
the dashboard shows it."""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient
from torch import nn

import ckptlab
from backend.app import create_app
from ckptlab.settings import Settings
from worker.profile import find_blocks


class _Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.lin(x)) + x


class _Net(nn.Module):
    def __init__(self, width: int = 32, depth: int = 4):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(8, width), nn.ReLU())  # mixed types: not the blocks
        self.layers = nn.ModuleList(_Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_profile_runs_a_model_in_hand_and_the_dashboard_lists_it(tmp_path):
    torch.manual_seed(0)
    model = _Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    url = f"sqlite:///{tmp_path / 'ckptlab.db'}"
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    summary = ckptlab.profile(model, (x, y), strategy="per_block", steps=3, timed_steps=2, database_url=url)
    assert summary["status"] == "succeeded", summary["error"]
    assert summary["param_count"] == sum(p.numel() for p in model.parameters())
    assert summary["gradients_match"] is True and summary["recompute_peak_bytes"] > 0
    # The caller's model is untouched: same weights, no checkpointing wrappers.
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(isinstance(m, _Block) for m in model.layers)

    with TestClient(create_app(Settings(database_url=url, data_dir=tmp_path))) as client:
        listed = client.get("/api/experiments").json()["data"]
    (row,) = [e for e in listed if e["id"] == summary["experiment_id"]]
    assert row["spec"]["model"] == {"kind": "python", "target": f"{__name__}:_Net", "depth": 4, "kwargs": {}}
    assert row["status"] == "succeeded"


def test_profile_without_targets_and_with_blocks_named(tmp_path):
    url = f"sqlite:///{tmp_path / 'ckptlab.db'}"
    summary = ckptlab.profile(
        _Net(depth=6),
        torch.randn(4, 8),
        blocks="layers",
        strategy="sequential",
        segments=2,
        steps=2,
        timed_steps=0,
        verify_gradients=False,
        database_url=url,
    )
    assert summary["status"] == "succeeded", summary["error"]
    assert summary["activation_bytes"] > 0


def test_blocks_are_the_longest_container_of_same_type_children():
    assert find_blocks(_Net(depth=5)) == "layers"
    with pytest.raises(ValueError, match="pass blocks="):
        find_blocks(nn.Linear(2, 2))


def test_profile_finds_a_llamas_decoder_layers_with_a_dict_sample_and_the_dashboard_lists_it(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64, vocab_size=100
    )
    model = transformers.AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, 100, (2, 16))
    url = f"sqlite:///{tmp_path / 'ckptlab.db'}"
    summary = ckptlab.profile(
        model, {"input_ids": ids, "labels": ids}, strategy="per_block", steps=2, timed_steps=1, database_url=url
    )
    assert summary["status"] == "succeeded", summary["error"]
    assert summary["model"] == f"LlamaForCausalLM ({params:,} parameters)"
    assert summary["blocks"] == "3 × LlamaDecoderLayer: transformers layout"
    assert summary["gradients_match"] is True and summary["activation_bytes"] > 0

    with TestClient(create_app(Settings(database_url=url, data_dir=tmp_path))) as client:
        listed = client.get("/api/experiments", params={"strategy": "per_block"}).json()["data"]
    (row,) = [e for e in listed if e["id"] == summary["experiment_id"]]
    assert row["spec"]["model"]["target"].endswith(":LlamaForCausalLM") and row["spec"]["model"]["depth"] == 3
    assert row["summary"]["param_count"] == params and row["summary"]["model"] == summary["model"]
    assert row["spec"]["checkpoint"]["strategy"] == "per_block"
