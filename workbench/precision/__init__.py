"""Precision: what shrinking a model to int8, fp16 or bf16 needs below the quantize stage.

calibration (the samples, from an iterable, a DataLoader or a folder), ort_quant (static QDQ
and dynamic quantization through onnxruntime.quantization), ncnn_int8 (ncnn's calibration
table and int8 model, in the formats ncnn2table and ncnn2int8 write). A layer of its own
beside rules: it runs models through runtime/, and stages/quantize.py is its one caller.
"""
