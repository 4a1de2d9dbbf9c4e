"""Task metrics of the zoo models (numpy only: used by make_zoo.py and deploy.py).

Each model's ``<name>.json`` names its ``task``; :func:`evaluate` turns the
model's first output on the whole eval set into the task's metrics, the first
key being the headline metric (higher is better, in percent).
"""

from __future__ import annotations

import numpy as np


def load_inputs(npz, meta) -> dict[str, np.ndarray]:
    """The model inputs stored in an eval/calib npz, as the model takes them.

    Eval images are stored as uint8 (``meta["input_scale"][name]`` = 1/255) to
    keep the files small; they become float32 exactly as make_zoo.py fed them.
    """
    feeds = {}
    for name in meta["inputs"]:
        x = np.asarray(npz[name])
        scale = meta.get("input_scale", {}).get(name)
        if scale is not None and x.dtype == np.uint8:
            x = x.astype(np.float32) * np.float32(scale)
        feeds[name] = x
    return feeds


def decode_detections(preds: np.ndarray, meta: dict, score_threshold: float = 0.5):
    """YOLO-style grid head ``[B, 4 + 1 + C, S, S]`` -> per image list of (x1, y1, x2, y2, cls, score).

    Channel 0: objectness logit; 1..C: class logits; then 2 centre offsets in
    the cell (sigmoid) and 2 sizes (sigmoid * image size). One box per cell.
    """
    n_cls = meta["num_classes"]
    stride = meta["stride"]
    size = meta["image_size"]
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
    out = []
    for p in preds:
        obj = sig(p[0])
        cls = p[1:1 + n_cls].argmax(axis=0)
        off = sig(p[1 + n_cls:3 + n_cls])
        wh = sig(p[3 + n_cls:5 + n_cls]) * size
        boxes = []
        for gy, gx in zip(*np.nonzero(obj > score_threshold)):
            cx = (gx + off[0, gy, gx]) * stride
            cy = (gy + off[1, gy, gx]) * stride
            w, h = wh[0, gy, gx], wh[1, gy, gx]
            boxes.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, int(cls[gy, gx]), float(obj[gy, gx])))
        out.append(boxes)
    return out


def _iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def detection_f1(preds, gt_boxes, gt_classes, meta, iou_threshold: float = 0.5) -> dict[str, float]:
    """F1 of class-correct detections at IoU >= 0.5 (greedy matching by score)."""
    tp = fp = fn = 0
    for dets, boxes, classes in zip(decode_detections(preds, meta), gt_boxes, gt_classes):
        gts = [(tuple(b), int(c)) for b, c in zip(boxes, classes) if c >= 0]
        used = [False] * len(gts)
        for d in sorted(dets, key=lambda d: -d[5]):
            best, best_j = 0.0, -1
            for j, (gb, gc) in enumerate(gts):
                if not used[j] and gc == d[4]:
                    iou = _iou(d[:4], gb)
                    if iou > best:
                        best, best_j = iou, j
            if best >= iou_threshold:
                used[best_j] = True
                tp += 1
            else:
                fp += 1
        fn += used.count(False)
    precision = tp / max(tp + fp, 1)
    recall = tp / max(tp + fn, 1)
    f1 = 2 * precision * recall / max(precision + recall, 1e-12)
    return {"f1": 100 * f1, "precision": 100 * precision, "recall": 100 * recall}


def ctc_greedy_decode(logits: np.ndarray, blank: int = 0) -> list[list[int]]:
    """Greedy CTC decoding of ``logits [B, T, K]``: best class per frame, repeats merged, blanks dropped."""
    best = np.asarray(logits).argmax(axis=-1)
    out = []
    for row in best:
        keep = np.ones(len(row), bool)
        keep[1:] = row[1:] != row[:-1]
        out.append([int(c) for c in row[keep] if c != blank])
    return out


def edit_distance(a, b) -> int:
    """Levenshtein distance between two sequences."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def ctc_metrics(logits: np.ndarray, labels: np.ndarray, blank: int = 0) -> dict[str, float]:
    """Sequence accuracy (exact match after greedy CTC decoding) and character accuracy
    (1 - total edit distance / total label length, floored at 0) of ``labels [B, L]`` padded with -1."""
    decoded = ctc_greedy_decode(logits, blank)
    truth = [[int(c) for c in row if c >= 0] for row in np.asarray(labels)]
    exact = sum(d == t for d, t in zip(decoded, truth))
    errors = sum(edit_distance(d, t) for d, t in zip(decoded, truth))
    total = sum(len(t) for t in truth)
    return {"seq_acc": 100 * exact / len(truth), "char_acc": 100 * max(0.0, 1 - errors / max(total, 1))}


def evaluate(meta: dict, output: np.ndarray, npz) -> dict[str, float]:
    """Metrics of ``output`` (the model's first output on the eval inputs)."""
    task = meta["task"]
    if task == "classification":
        labels = np.asarray(npz["labels"])
        return {"top1": 100 * float(np.mean(output.argmax(axis=-1) == labels))}
    if task == "segmentation":
        labels = np.asarray(npz["masks"]).astype(np.int64)
        pred = output.argmax(axis=1)
        ious = []
        for c in range(meta["num_classes"]):
            union = np.sum((pred == c) | (labels == c))
            if union:
                ious.append(np.sum((pred == c) & (labels == c)) / union)
        return {"miou": 100 * float(np.mean(ious)), "pixel_acc": 100 * float(np.mean(pred == labels))}
    if task == "detection":
        return detection_f1(output, np.asarray(npz["boxes"]), np.asarray(npz["classes"]), meta)
    if task == "sequence_tagging":
        labels = np.asarray(npz["labels"])
        return {"frame_acc": 100 * float(np.mean(output.argmax(axis=-1) == labels))}
    if task == "ctc":
        return ctc_metrics(output, np.asarray(npz["labels"]), meta.get("blank", 0))
    raise ValueError(f"unknown task {task!r}")
