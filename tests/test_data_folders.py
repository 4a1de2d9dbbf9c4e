"""``--data DIR``: a folder of .npz files whose samples differ in dynamic dimensions (sentences of different
lengths for a BERT-like model with an attention mask), read lazily, batched shape by shape (a batch never mixes
shapes, one-sample files of one shape still run in full batches), for every command that takes data."""

import numpy as np
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from qtool.api import calibrate, finetune, rewrite_eval, rewrite_train, simulate
from qtool.config import CalibrationConfig, TrainSchedule
from qtool.data import InputSpec, load_calibration_data
from qtool.errors import QtoolError
from qtool.finetune.config import FinetuneConfig
from qtool.simulate.config import SimulateConfig
from qtool.simulate.inputs import JoinedLabels
from qtool.cli import main

HIDDEN, CLASSES = 8, 3
LENGTHS = [5, 7, 5, 9, 7, 5, 5, 7]  # one sample per file, shapes interleaved
SPECS = [InputSpec("ids", np.dtype(np.int64), ("batch", "seq")),
         InputSpec("mask", np.dtype(np.int64), ("batch", "seq"))]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _bert_like(per_token=False):
    """ids, mask [batch, seq] -> embedding, one masked self-attention head, mean over the sequence -> logits
    (``per_token``: logits [batch, seq, classes] and their max ``score`` [batch, seq])."""
    rng = np.random.default_rng(0)
    w = lambda *s: numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.5)  # noqa: E731
    inits = [w(16, HIDDEN), w(HIDDEN, HIDDEN), w(HIDDEN, HIDDEN), w(HIDDEN, CLASSES)]
    for init, name in zip(inits, ["emb", "wq", "wk", "wc"]):
        init.name = name
    inits += [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
              numpy_helper.from_array(np.array(-1e4, np.float32), "big"),
              numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    n = helper.make_node
    nodes = [n("Gather", ["emb", "ids"], ["e"]), n("MatMul", ["e", "wq"], ["q"]), n("MatMul", ["e", "wk"], ["k"]),
             n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), n("MatMul", ["q", "kt"], ["s"]),
             n("Cast", ["mask"], ["mf"], to=TensorProto.FLOAT), n("Sub", ["one", "mf"], ["inv"]),
             n("Mul", ["inv", "big"], ["neg"]), n("Unsqueeze", ["neg", "axis1"], ["neg3"]),
             n("Add", ["s", "neg3"], ["sm"]), n("Softmax", ["sm"], ["p"], axis=-1), n("MatMul", ["p", "e"], ["c"]),
             n("ReduceMean", ["c"], ["pooled"], axes=[1], keepdims=0), n("MatMul", ["pooled", "wc"], ["logits"])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])]
    if per_token:
        nodes[-2:] = [n("MatMul", ["c", "wc"], ["logits"]), n("ReduceMax", ["logits"], ["score"], axes=[2], keepdims=0)]
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", CLASSES]),
                   helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", "seq"])]
    graph = helper.make_graph(
        nodes, "bert_like",
        [helper.make_tensor_value_info(s.name, TensorProto.INT64, ["batch", "seq"]) for s in SPECS], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _sentences(lengths, seed=1, per_file=1):
    rng = np.random.default_rng(seed)
    out = []
    for length in lengths:
        mask = np.ones((per_file, length), np.int64)
        mask[:, length - 1 - rng.integers(0, 2):] = 0  # some padding
        out.append({"ids": rng.integers(0, 16, (per_file, length)), "mask": mask,
                    "labels": rng.integers(0, CLASSES, per_file)})
    return out


def _write(folder, samples):
    folder.mkdir(exist_ok=True)
    for i, arrays in enumerate(samples):
        np.savez(folder / f"{i:03d}.npz", **arrays)
    return folder


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    work = tmp_path_factory.mktemp("folders")
    model = work / "bert.onnx"
    model.write_bytes(_bert_like().SerializeToString())
    samples = _sentences(LENGTHS)
    return work, model, samples, _write(work / "mixed", samples)


def test_batches_never_mix_shapes_and_join_one_sample_files(bert):
    work, _, samples, folder = bert
    data = load_calibration_data(folder, SPECS)
    assert data.num_samples == 8 and data.ignored == ["labels"]
    shapes = [b["ids"].shape for b in data.batches(16)]
    assert shapes == [(4, 5), (3, 7), (1, 9)] and data.num_batches(16) == 3  # by shape, first met first
    assert [b["ids"].shape for b in data.batches(3)] == [(3, 5), (1, 5), (3, 7), (1, 9)]
    order = [i for length in (5, 7, 9) for i, n in enumerate(LENGTHS) if n == length]
    got = np.concatenate([b["ids"] for b in data.batches(3) if b["ids"].shape[1] == 5])
    assert np.array_equal(got, np.concatenate([samples[i]["ids"] for i in order[:4]]))
    assert np.array_equal(data.read_array("labels"), np.concatenate([samples[i]["labels"] for i in order]))


def test_calibrating_a_folder_merges_what_each_file_gives(bert):
    _, model, _, folder = bert
    whole = calibrate(str(model), str(folder))
    files = sorted(folder.iterdir())
    each = [calibrate(str(model), str(f)).ranges for f in files]
    assert whole.num_samples == 8 and whole.num_batches == 3 and whole.ranges
    for name, (lo, hi) in whole.ranges.items():
        assert lo == min(r[name][0] for r in each) and hi == max(r[name][1] for r in each), name
    for method in ("ema", "entropy", "percentile", "mse"):  # the histograms take batches of any shape
        got = calibrate(str(model), str(folder), calibration=CalibrationConfig(method=method, batch_size=2)).ranges
        assert got and all(np.isfinite(r).all() and r[0] < r[1] for r in got.values()), method


def test_one_sample_files_of_one_shape_calibrate_as_the_stacked_file(bert, tmp_path):
    _, model, _, _ = bert
    samples = _sentences([6] * 7, seed=3)
    folder = _write(tmp_path / "same", samples)
    stacked = tmp_path / "stacked.npz"
    np.savez(stacked, **{k: np.concatenate([s[k] for s in samples]) for k in ("ids", "mask")})
    for method in ("ema", "entropy"):  # ema steps per batch: the batches must be the same
        config = CalibrationConfig(method=method, batch_size=3)
        assert calibrate(str(model), str(folder), calibration=config).ranges == \
            calibrate(str(model), str(stacked), calibration=config).ranges


def test_a_bad_file_is_one_error_naming_the_file_and_the_input(tmp_path):
    specs = [InputSpec("x", np.dtype(np.float32), ("batch", "n", 4)), InputSpec("y", np.dtype(np.float32), ("batch",))]
    folder = tmp_path / "bad"
    folder.mkdir()
    np.savez(folder / "a.npz", x=np.zeros((2, 3, 4), np.float32), y=np.zeros(2, np.float32))
    np.savez(folder / "b.npz", x=np.zeros((1, 5, 4), np.float32), y=np.zeros(1, np.float32))
    assert load_calibration_data(folder, specs).num_samples == 3
    cases = {"c.npz": (dict(x=np.zeros((1, 5, 3), np.float32), y=np.zeros(1, np.float32)), r"dimension 2 is 3"),
             "d.npz": (dict(x=np.zeros((1, 5, 4), np.float32)), r"no array for model input 'y'"),
             "e.npz": (dict(x=np.zeros((1, 5, 4), np.float64), y=np.zeros(1, np.float32)), r"expected dtype float32")}
    for name, (arrays, message) in cases.items():
        np.savez(folder / name, **arrays)
        with pytest.raises(QtoolError, match=message) as raised:
            load_calibration_data(folder, specs)
        assert str(folder / name) in str(raised.value) and ("'x'" in str(raised.value) or "'y'" in str(raised.value))
        (folder / name).unlink()


def test_empty_non_data_and_nested_folders(tmp_path):
    specs = [InputSpec("x", np.dtype(np.float32), ("batch", 2))]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(QtoolError, match=r"holds no \.npz or \.npy file \(it is empty\)"):
        load_calibration_data(empty, specs)
    (empty / "notes.txt").write_text("x")
    (empty / "sub").mkdir()
    np.save(empty / "sub" / "x.npy", np.zeros((1, 2), np.float32))  # sub-folders are not read
    with pytest.raises(QtoolError, match=r"holds no \.npz or \.npy file \(it holds notes\.txt, sub/\)"):
        load_calibration_data(empty, specs)
    np.save(empty / "a.npy", np.ones((3, 2), np.float32))  # a .npy feeds a one-input model
    data = load_calibration_data(empty, specs)
    assert data.num_samples == 3 and [b["x"].shape for b in data.batches(2)] == [(2, 2), (1, 2)]


def test_cli_refuses_a_bad_folder_with_exit_2(bert, tmp_path):
    _, model, samples, _ = bert
    folder = _write(tmp_path / "cli", samples[:2])
    np.savez(folder / "z.npz", ids=samples[0]["ids"].astype(np.int32), mask=samples[0]["mask"])
    result = invoke("calibrate", model, "--data", folder, "-o", tmp_path / "r.json")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert str(folder / "z.npz") in result.stderr and "'ids'" in result.stderr
    (folder / "z.npz").unlink()
    ok = invoke("rewrite-eval", model, "-o", tmp_path / "q.onnx", "--data", folder)
    assert ok.exit_code == 0, ok.output


def test_rewrite_eval_auto_and_simulate_on_a_folder(bert, tmp_path):
    _, model, samples, folder = bert
    # auto holds out the first 16 samples in the batches' order (the 8 of length 5, the 8 of length 7)
    calib = _write(tmp_path / "calib", _sentences([5, 7, 9, 5, 7] * 4, seed=6))
    written = rewrite_eval(str(model), str(tmp_path / "q.onnx"), calibration_data=str(calib),
                           calibration=CalibrationConfig(method="auto", batch_size=4)).to_dict()["output_check"]
    assert written["tried_calibrated_on"] == 4 and written["samples"] == 16 and len(written["tried"]) == 3
    result = simulate(str(model), str(folder), SimulateConfig(labels="labels", batch_size=16,
                                                              quantized=(str(tmp_path / "q.onnx"),),
                                                              latency_rounds=1))
    assert result.samples == 8 and result.models[0].output.sqnr_db > 10 and result.latency is not None
    # the same samples, one shape: the folder's metrics are the stacked file's
    same = _write(tmp_path / "same", _sentences([6] * 5, seed=4))
    stacked = tmp_path / "stacked.npz"
    np.savez(stacked, **{k: np.concatenate([np.load(f)[k] for f in sorted(same.iterdir())])
                         for k in ("ids", "mask", "labels")})
    config = SimulateConfig(labels="labels", batch_size=2, weight_bits=(8,), calibration_data=str(folder))
    a, b = simulate(str(model), str(same), config), simulate(str(model), str(stacked), config)
    assert a.calibration.samples == 8  # the what-if table calibrated on the folder of mixed lengths
    assert a.samples == b.samples == 5 and a.float_accuracy == b.float_accuracy
    assert a.models[0].output.sqnr_db == b.models[0].output.sqnr_db and a.models[0].accuracy == b.models[0].accuracy


def test_finetune_on_a_folder_of_two_shapes(bert, tmp_path):
    _, model, _, _ = bert
    folder = _write(tmp_path / "train", _sentences([4, 6, 4, 6, 6], seed=5, per_file=2))
    rewrite_train(str(model), str(tmp_path / "t.onnx"), calibration_data=str(folder),
                  schedule=TrainSchedule(freeze_bn_delay=0))
    result = finetune(str(tmp_path / "t.onnx"), str(folder), str(tmp_path / "tuned.onnx"),
                      FinetuneConfig(steps=3, batch_size=4, labels="labels", validation_data=str(folder)))
    assert result.end_step == 3 and 0 <= result.after <= 1 and result.metric_name == "accuracy"


def test_simulate_labels_come_from_each_file(bert, tmp_path):
    _, model, samples, _ = bert
    folder = _write(tmp_path / "labels", samples[:3])
    np.savez(folder / "003.npz", ids=samples[3]["ids"], mask=samples[3]["mask"])  # no labels
    with pytest.raises(QtoolError, match=r"no labels array 'labels' in '.*003\.npz'"):
        simulate(str(model), str(folder), SimulateConfig(labels="labels"))
    joined = JoinedLabels([np.zeros((2, 5)), np.ones((1, 7)), np.full((3, 5), 2.0)])  # per-position, two shapes
    assert len(joined) == 6 and joined[0:2].shape == (2, 5) and joined[2:3].shape == (1, 7)
    assert joined[3:6].tolist() == [[2.0] * 5] * 3 and joined[1:2].tolist() == [[0.0] * 5]


def test_a_folder_is_read_lazily_one_file_open_at_a_time(tmp_path, monkeypatch):
    from qtool import data as data_module
    specs = [InputSpec("x", np.dtype(np.float32), ("batch", 64))]
    folder = tmp_path / "lazy"
    folder.mkdir()
    for i in range(40):
        np.save(folder / f"{i:02d}.npy", np.full((1, 64), i, np.float32))
    data = load_calibration_data(folder, specs)
    opened, now, most = [], [0], [0]
    real_open = data_module.StoredArray._open

    class Counting:
        def __init__(self, cm):
            self.cm = cm

        def __enter__(self):
            now[0] += 1
            most[0] = max(most[0], now[0])
            opened.append(1)
            return self.cm.__enter__()

        def __exit__(self, *exc):
            now[0] -= 1
            return self.cm.__exit__(*exc)

    monkeypatch.setattr(data_module.StoredArray, "_open", lambda self: Counting(real_open(self)))
    batches = data.batches(16)
    first = next(batches)
    assert first["x"].shape == (16, 64) and len(opened) == 16 and most[0] == 1  # 16 files read, one at a time
    rest = list(batches)
    assert [b["x"].shape[0] for b in rest] == [16, 8] and rest[-1]["x"][-1, 0] == 39


def test_files_with_different_inputs_without_a_batch_axis_calibrate_both_if_branches(tmp_path):
    """A sample rate per file (an input with no batch axis, fed whole): each file's batches take its own If
    branch, so a folder calibrates both branches (one file can hold one rate only)."""
    from onnx_rewrite.test_if_branches import data, silero_like
    folder = tmp_path / "rates"
    folder.mkdir()
    np.savez(folder / "a.npz", **data(6, 16000))
    np.savez(folder / "b.npz", **data(5, 8000))
    np.savez(folder / "c.npz", **data(3, 16000))
    loaded = load_calibration_data(folder, [InputSpec("x", np.dtype(np.float32), ("N", 4, 32)),
                                            InputSpec("sr", np.dtype(np.int64), (), None)])
    assert [(b["x"].shape[0], int(b["sr"])) for b in loaded.batches(4)] == \
        [(4, 16000), (4, 16000), (1, 16000), (4, 8000), (1, 8000)]
    result = rewrite_eval(silero_like(18), calibration_data=str(folder),
                          calibration=CalibrationConfig(batch_size=4))
    taken = {b.attribute: b.samples for b in result.branches}
    assert taken == {"then_branch": 9, "else_branch": 5} and all(b.result is not None for b in result.branches)


def test_finetune_names_the_file_without_labels(tmp_path):
    folder = _write(tmp_path / "train", _sentences([4, 6], seed=5))
    np.savez(folder / "002.npz", **{k: v for k, v in _sentences([4])[0].items() if k != "labels"})
    model = tmp_path / "m.onnx"
    model.write_bytes(_bert_like().SerializeToString())
    rewrite_train(str(model), str(tmp_path / "t.onnx"), calibration_data=str(folder),
                  schedule=TrainSchedule(freeze_bn_delay=0))
    with pytest.raises(QtoolError, match=r"training data '.*002\.npz' has no array 'labels'"):
        finetune(str(tmp_path / "t.onnx"), str(folder), None, FinetuneConfig(steps=1, labels="labels"))


def test_simulate_per_token_classes_over_a_folder_of_lengths(tmp_path):
    """A token tagger: accuracy over every token of every length; an output whose values per sample follow the
    length is values, not classes."""
    import onnxruntime as ort
    model = tmp_path / "tagger.onnx"
    model.write_bytes(_bert_like(per_token=True).SerializeToString())
    rng = np.random.default_rng(8)
    samples = [{**s, "labels": rng.integers(0, CLASSES, s["ids"].shape)} for s in _sentences([5, 7, 5, 9], seed=8)]
    folder = _write(tmp_path / "tagged", samples)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    right = sum(int(np.sum(session.run(["logits"], {"ids": s["ids"], "mask": s["mask"]})[0].argmax(-1) == s["labels"]))
                for s in samples)
    result = simulate(str(model), str(folder), SimulateConfig(labels="labels", class_axis=2, output="logits"))
    assert result.samples == 4 and result.float_correct == right and result.float_accuracy == right / 26
    assert result.positions is None and result.predictions == 26
    scores = simulate(str(model), str(folder), SimulateConfig(output="score"))
    assert scores.models[0].agreement is None and any("different number of values per sample" in n
                                                      for n in scores.notes)


def test_finetune_counts_each_shapes_first_step_as_its_compile():
    """The first batch of each shape group compiles the training step for that shape: those steps are compile
    time, not step time (only the very first was counted, so the seconds per step and the ETA took the other
    shapes' compiles)."""
    from qtool.finetune.train import _Batches, _Group

    class Train:  # _Batches reads the groups and feeds a group's rows
        groups = [_Group({"x": np.zeros((5, 2 + g), np.float32)}, None, 5) for g in range(3)]

        def feed(self, idx, group):
            return {"x": group.inputs["x"][idx]}

    batches = _Batches(Train(), 2, np.random.default_rng(0))
    firsts = []
    for _ in range(12):  # two epochs: 3 groups x 2 batches of 2
        batch, _ = batches.next()
        firsts.append((batch["x"].shape[1], batches.new_shape))
    assert sorted(shape for shape, new in firsts if new) == [2, 3, 4]  # once per shape, never again
    assert all(not new for shape, new in firsts[6:])
