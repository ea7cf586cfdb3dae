"""The Ray executor on a local Ray instance gives exactly the local executor's output."""

import json

import pytest

from lmforge.data.pipeline import load_pipeline_config, read_output, run_pipeline


@pytest.fixture(scope="module")
def ray_instance():
    import ray  # the `ray` extra, installed with `dev`

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_output_equals_local_output(ray_instance, tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    for shard in range(4):
        rows = [
            {"id": f"{shard}-{i}", "text": f"Mail user{i}@example.com about item {i % 7} of batch."}
            for i in range(40)
        ]
        (root / f"{shard}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    flags = {"input": [str(root)], "steps": "pii,exact_dedup,minhash_dedup", "workers": 2}
    sets = ["read.shard_bytes=1", "minhash_dedup.threshold=0.7"]
    local = run_pipeline(load_pipeline_config(None, {**flags, "output": str(tmp_path / "l")}, sets))
    remote = run_pipeline(
        load_pipeline_config(
            None, {**flags, "output": str(tmp_path / "r"), "executor": "ray"}, sets
        )
    )
    docs = [(d.id, d.text) for d in read_output(tmp_path / "l")]
    assert docs == [(d.id, d.text) for d in read_output(tmp_path / "r")]
    assert remote["shards"] == 4 and remote["documents_out"] == local["documents_out"] == len(docs)
    assert [s["removed"] for s in remote["steps"]] == [s["removed"] for s in local["steps"]]
    assert local["steps"][2]["removed"] == {"duplicate": 153}  # 7 distinct texts once masked
