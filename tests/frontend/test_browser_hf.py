"""Browser test of model kind ``hf``: the form offers the architectures and their config
fields from ``/api/meta``, an experiment submitted from it runs on the real worker (a tiny
Llama built from its config, nothing downloaded) and its page draws the charts."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.frontend.support import Tab, _get_json, _trace_names, submit_and_finish

pytest.importorskip("transformers")


def test_submit_an_hf_llama_from_the_form_and_see_its_charts(app_url: str, tab: Tab) -> None:
    page = tab.page
    page.goto(app_url + "/#/new")
    page.select_option("#model\\.kind", "hf")
    page.select_option("#f-hf-architecture", "resnet")
    expect(page.locator("#f-hf-image_size")).to_have_value("64")  # the architecture's example
    expect(page.locator("#f-hf-attn_implementation")).to_be_hidden()  # no attention in a ResNet
    page.select_option("#f-hf-architecture", "llama")
    expect(page.locator("#f-hf-blocks")).to_contain_text("LlamaDecoderLayer")
    expect(page.locator("#f-hf-hidden_size")).to_have_value("256")
    page.fill("#f-hf-hidden_size", "32")
    page.fill("#f-hf-num_hidden_layers", "2")
    page.fill("#f-hf-num_attention_heads", "2")
    page.fill("#f-hf-num_key_value_heads", "")  # left out: the config's default (= the heads)
    page.fill("#f-hf-intermediate_size", "64")
    page.fill("#f-hf-vocab_size", "100")
    page.fill("#f-hf-seq_len", "16")
    page.fill("#batch_size", "2")
    page.fill("#steps", "3")
    page.fill("#timed_steps", "2")
    page.select_option("#checkpoint\\.strategy", "per_block")
    page.select_option("#device", "cpu")
    preview = page.locator("#request-preview")
    expect(preview).to_contain_text('"architecture": "llama"')
    expect(preview).not_to_contain_text("num_key_value_heads")
    exp_id = submit_and_finish(page)
    code, exp = _get_json(f"{app_url}/api/experiments/{exp_id}")
    assert code == 200
    assert exp["spec"]["model"] == {
        "kind": "hf",
        "architecture": "llama",
        "attn_implementation": "sdpa",
        "seq_len": 16,
        "image_size": None,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "vocab_size": 100,
    }  # the fields left empty (kv heads, dropout, tying) are left out: the config's defaults
    assert page.evaluate("document.getElementById('chart-memory').data[0].x.length") >= 1
    assert _trace_names(page, "chart-time")[:3] == ["forward", "backward", "optimizer"]
    expect(page.locator("#exp-summary")).to_contain_text("Activation memory")
    expect(page.locator("#exp-title, #exp-summary, body").first).to_contain_text("hf llama")
    tab.assert_no_errors()


def test_torchvision_where_it_does_not_import_is_refused_next_to_the_kind(app_url: str, tab: Tab) -> None:
    from ckptlab.spec.torchvision_model import torchvision_problem

    page = tab.page
    if torchvision_problem() is None:
        pytest.skip("torchvision imports here: the kind is accepted")
    page.goto(app_url + "/#/new")
    page.select_option("#model\\.kind", "torchvision")
    page.select_option("#f-torchvision-architecture", "resnet50")
    expect(page.locator("#f-torchvision-architecture")).to_contain_text("resnet50 — 16 blocks")
    page.click("#submit")
    error = page.locator(".field-error", has_text="torchvision does not import here")
    expect(error).to_be_visible()
    assert page.url.endswith("#/new")
    tab.assert_no_errors()
