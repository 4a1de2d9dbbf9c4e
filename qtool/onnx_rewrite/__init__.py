"""Graph rewrites on in-memory ONNX models (onnx-ir): pure transformations, written as rules.

Nothing here reads files, runs a model or calibrates (``qtool.api`` joins
those steps). One module per transformation:

- ``matcher`` / ``patterns``: declared forward chain patterns with reasons;
- ``fold_batch_norms``: the eval fold (spec section 3), a rule class;
- ``placement``: where quantizers go (spec sections 2 and 2b), one
  :class:`~qtool.onnx_rewrite.placement.PlacementRule` class per rule;
- ``eval_graph``: the plan as QuantizeLinear/DequantizeLinear (spec section 6),
  with the onnxruntime additions (carried quantizers share their source's scale, int32 biases);
- ``eval_rewrite``: the eval rewrite's steps (strip, opset, fold, plan, encode);
- ``fake_quant_function``: ``qtool::FakeQuant``, TF's FakeQuant as a model-local ONNX function;
- ``fold_batch_norms_train``: the training fold (spec section 3, TF's correction scheme);
- ``train_graph``: the plan as FakeQuant nodes with state and the ``qtool.training``
  contract (spec sections 4-5), and its removal for the eval rewrite;
- ``train_rewrite``: the training rewrite's steps;
- ``report``: the typed results (:class:`RewriteResult`, :class:`TrainResult`) and their text.
"""
