"""Precision: what shrinking a model to int8, fp16 or bf16 needs below the quantize stage.

Calibration samples: calibration (picked, checked, recorded) and calibration_sources (from
an iterable, a DataLoader or a folder), prepared by preprocess (the model's preprocessing,
set once on a CalibrationSource), split by picking (the samples held out to measure on),
checked by calibration_range (a range far from the example inputs'). exclusion: what stays
float, from any name a user or a ranking of an int8 model has. ONNX Runtime: ort_quant
(static QDQ and dynamic quantization through onnxruntime.quantization), ort_checks,
ort_failures, qdq. ncnn, in the formats ncnn2table and ncnn2int8 write: quantizable (which
layers int8 covers), thresholds (KL / ACIQ / minmax clip of a blob, pure numpy),
weight_scales, float_weights (the fp32 weights in the .bin), int8_table (the table's text),
ncnn_calibration (the table made from samples), int8_plan and ncnn_int8 (the int8 model).
lowprec and snr serve the comparison. A layer of its own beside rules: it runs models
through runtime/; stages/quantize.py drives it, and comparison/ reads lowprec, qdq and snr.
"""
