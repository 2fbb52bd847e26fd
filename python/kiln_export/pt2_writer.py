"""save(ep, path): torch.export.save's .pt2 archive, its tensors written from their own storage.

torch.export.save (torch/export/pt2_archive/_package.py, torch 2.13) turns each tensor's storage into a Python
`bytes` object before writing it (`_get_raw_tensor_bytes`): one extra copy of the largest tensor at a time, on
top of the model (E2B's per-layer embedding table alone is 4.7 GB in bf16). This writer makes the same archive
with the same torch pieces -- torch's zip writer (PyTorchFileWriter: stored, 64-byte aligned records), its storage
grouping of tensors that share memory, its payload configs and its graph serializer -- but hands each storage to
the zip writer as it is (`write_record` takes a storage: no copy), one at a time.

The archive, for a model named "model" (the root folder is the file's stem; torch.export.load reads either):
    <root>/data/weights/weight_<i>                  raw storage bytes of each parameter / persistent buffer group
    <root>/data/weights/model_weights_config.json   fqn -> {path_name, is_param, use_pickle, tensor_meta}
    <root>/data/constants/tensor_<i>                the same for tensor constants (non-persistent buffers, lifted
    <root>/data/constants/model_constants_config.json   constants)
    <root>/models/model.json                        the serialized graph (torch's serializer)
    <root>/data/sample_inputs/model.pt              the example inputs (pickled)
    <root>/archive_format, archive_version, byteorder, .data/version, .data/serialization_id
Tensors that need pickling (tensor subclasses such as torchao's quantized weights) go through torch's own code.
"""
from __future__ import annotations

import os


def _write_raw(writer, items: dict, model_name: str, config: dict, directory: str, prefix: str, idx: int) -> int:
    """torch's _save_raw_tensors without the bytes copy: each storage group's storage written as it is."""
    import torch
    from torch._export.serde import schema
    from torch._export.serde.serialize import serialize_tensor_meta
    from torch.export.pt2_archive import _package as pkg

    if not items:
        return idx
    weights = {model_name: pkg.Weights(items)}
    for group in pkg.group_weights(weights):
        complete = pkg.get_complete_tensor(group, weights)  # the tensor whose storage covers the group's
        path_name = f"{prefix}{idx}"
        archive_path = os.path.join(directory, path_name)
        if pkg._is_fake_tensor(complete) or not complete.data_ptr():
            writer.archive_file.write_record(archive_path, b"", 0)
        else:
            storage = complete.cpu().untyped_storage()
            writer.archive_file.write_record(archive_path, storage, storage.nbytes())
            del storage
        idx += 1
        for _, fqn in group:
            tensor, _ = weights[model_name].get_weight(fqn)
            config[fqn] = schema.PayloadMeta(path_name=path_name, is_param=isinstance(tensor, torch.nn.Parameter),
                                             use_pickle=False, tensor_meta=serialize_tensor_meta(tensor))
    return idx


def _package_tensors(writer, model_name: str, tensors: dict, directory: str, prefix: str, pickle_protocol: int,
                     materialize=None):
    """A payload config for `tensors` (fqn -> tensor), the raw ones written from their storage; fake tensors
    (shapes without storage) are given their values by `materialize(fqn, fake)` one at a time, each written and
    dropped before the next (a fake tensor named twice, a tied weight, is written once)."""
    import torch
    from torch._export.serde import schema
    from torch._export.serde.serialize import serialize_tensor_meta
    from torch.export.pt2_archive import _package as pkg

    config: dict = {}
    pickled, raw = [], {}
    idx = writer.count_prefix(os.path.join(directory, prefix))
    written: dict = {}  # id(fake) -> path_name
    for fqn, t in tensors.items():
        if not pkg._is_fake_tensor(t):
            continue
        if materialize is None:
            raise ValueError(f"{fqn} is a fake tensor and no values were given for it")
        if id(t) not in written:
            real = materialize(fqn, t)
            if real.shape != t.shape or real.dtype != t.dtype or not real.is_contiguous():
                raise ValueError(f"{fqn}: materialized as {real.dtype}{list(real.shape)}, the program has "
                                 f"{t.dtype}{list(t.shape)} (contiguous)")
            written[id(t)] = f"{prefix}{idx}"
            storage = real.untyped_storage()
            writer.archive_file.write_record(os.path.join(directory, written[id(t)]), storage, storage.nbytes())
            del real, storage
            idx += 1
        config[fqn] = schema.PayloadMeta(path_name=written[id(t)], is_param=isinstance(t, torch.nn.Parameter),
                                         use_pickle=False, tensor_meta=serialize_tensor_meta(t))
    for fqn, t in tensors.items():
        if pkg._is_fake_tensor(t):
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fqn}: only tensors are written here, got {type(t).__name__}")
        if pkg._should_use_pickle(t):
            pickled.append((fqn, t))
        else:
            raw[fqn] = (t, pkg.TensorProperties(t))
    idx = pkg._save_pickled_tensors(pickled, writer, config, directory, prefix, idx, pickle_protocol)
    _write_raw(writer, raw, model_name, config, directory, prefix, idx)
    return schema.PayloadConfig(config=config)


def save(ep, path: str, pickle_protocol: int | None = None, materialize=None) -> None:
    """torch.export.save(ep, path) for a program whose constants are plain tensors, without copying them.
    `materialize(fqn, fake) -> tensor` gives the values of the program's fake weights (a model exported with
    fake tensors: kiln_export/gemma4.py's build_deferred), produced and written one at a time."""
    import torch
    from torch._export.serde.serialize import serialize
    from torch.export.pt2_archive import _package as pkg
    from torch.export.pt2_archive.constants import (CONSTANTS_CONFIG_FILENAME_FORMAT, CONSTANTS_DIR,
                                                    MODELS_FILENAME_FORMAT, SAMPLE_INPUTS_FILENAME_FORMAT,
                                                    TENSOR_CONSTANT_FILENAME_PREFIX, WEIGHT_FILENAME_PREFIX,
                                                    WEIGHTS_CONFIG_FILENAME_FORMAT, WEIGHTS_DIR)

    if pickle_protocol is None:
        pickle_protocol = pkg.DEFAULT_PICKLE_PROTOCOL
    if not all(isinstance(c, torch.Tensor) for c in ep.constants.values()):  # script objects: torch's own path
        torch.export.save(ep, path, pickle_protocol=pickle_protocol)
        return
    name = "model"
    with pkg.PT2ArchiveWriter(os.fspath(path)) as writer:
        weights = _package_tensors(writer, name, dict(ep.state_dict), WEIGHTS_DIR, WEIGHT_FILENAME_PREFIX,
                                   pickle_protocol, materialize)
        pkg._package_payload_config(writer, weights, WEIGHTS_CONFIG_FILENAME_FORMAT.format(name))
        constants = _package_tensors(writer, name, dict(ep.constants), CONSTANTS_DIR,
                                     TENSOR_CONSTANT_FILENAME_PREFIX, pickle_protocol)
        pkg._package_payload_config(writer, constants, CONSTANTS_CONFIG_FILENAME_FORMAT.format(name))
        artifact = serialize(ep, None, pickle_protocol, serialize_state_dict=False, serialize_constants=False)
        writer.write_bytes(MODELS_FILENAME_FORMAT.format(name), artifact.exported_program)
        writer.write_bytes(SAMPLE_INPUTS_FILENAME_FORMAT.format(name), artifact.example_inputs)
