"""ONNX serving: export of an encoder or a fine-tuned model (:mod:`.onnx_export`, the graphs
in :mod:`.graph`) and onnxruntime sessions over them (:mod:`.onnx_runtime`), behind
``Featurizer(..., backend="onnx")`` and ``smiexlm predict --backend onnx``."""
