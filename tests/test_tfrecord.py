"""TFRecord datasets (issue 31, first format): written and read back byte-equal, each sample once
whatever the workers, every record a valid ``tf.train.Example`` (parsed by protobuf itself from
TensorFlow's own schema), and a corrupt record a failure that names the file and the offset."""

from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import REPO, samples_digest
from perfkit.measuring.data import datasets, tfrecord

SPEC = datasets.DatasetSpec(format="tfrecord", n_samples=48, sample_bytes=300, seed=3)


@pytest.fixture
def stored(tmp_path):
    path, made = datasets.ensure(SPEC, tmp_path / "cache")
    assert made
    return path


def test_written_and_read_back_byte_equal_at_random_and_in_order(stored):
    reader = datasets.reader(stored, SPEC)
    expected = samples_digest(datasets.sample_raw(SPEC, i) for i in range(SPEC.n_samples))
    order = np.random.default_rng(0).permutation(SPEC.n_samples)
    by_index = {int(i): reader.read_raw(int(i)) for i in order}  # random access through the index
    assert samples_digest(by_index[i] for i in range(SPEC.n_samples)) == expected
    in_order = [tfrecord.decode_example(d) for d in tfrecord.iter_records(stored / tfrecord.FILE)]
    assert [e["index"] for e in in_order] == [[i] for i in range(SPEC.n_samples)]
    assert samples_digest(np.frombuffer(e["data"], np.uint8) for e in in_order) == expected
    reader.close()


def _example_class():
    """tf.train.Example built from TensorFlow's example.proto / feature.proto field numbers by
    protobuf's own descriptor machinery: an independent parser of what perfkit writes."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FileDescriptorProto(name="example_test.proto", package="tensorflow", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto

    def message(name, *fields, nested=()):
        m = f.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            field = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = type_name
        for n in nested:
            m.nested_type.add().CopyFrom(n)
        return m

    message("BytesList", ("value", 1, T.TYPE_BYTES, T.LABEL_REPEATED, None))
    message("Int64List", ("value", 1, T.TYPE_INT64, T.LABEL_REPEATED, None))
    message("Feature", ("bytes_list", 1, T.TYPE_MESSAGE, T.LABEL_OPTIONAL, ".tensorflow.BytesList"),
            ("int64_list", 3, T.TYPE_MESSAGE, T.LABEL_OPTIONAL, ".tensorflow.Int64List"))
    entry = descriptor_pb2.DescriptorProto(name="FeatureEntry", options=descriptor_pb2.MessageOptions(map_entry=True))
    entry.field.add(name="key", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=T.TYPE_MESSAGE, label=T.LABEL_OPTIONAL,
                    type_name=".tensorflow.Feature")
    message("Features", ("feature", 1, T.TYPE_MESSAGE, T.LABEL_REPEATED, ".tensorflow.Features.FeatureEntry"),
            nested=[entry])
    message("Example", ("features", 1, T.TYPE_MESSAGE, T.LABEL_OPTIONAL, ".tensorflow.Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def test_every_record_is_a_tf_train_example_and_its_crcs_are_tensorflows(stored):
    Example = _example_class()
    records = list(tfrecord.iter_records(stored / tfrecord.FILE))
    for i in (0, 17, SPEC.n_samples - 1):
        parsed = Example.FromString(records[i])
        assert list(parsed.features.feature["index"].int64_list.value) == [i]
        assert parsed.features.feature["data"].bytes_list.value[0] == datasets.sample_raw(SPEC, i).tobytes()
    # The other way: protobuf's own serialization reads back through perfkit's decoder.
    ours = Example()
    ours.features.feature["index"].int64_list.value.append(-5)
    ours.features.feature["data"].bytes_list.value.append(b"\x00\xff")
    assert tfrecord.decode_example(ours.SerializeToString()) == {"index": [-5], "data": b"\x00\xff"}
    # CRC-32C's check value (RFC 3720), masked as TensorFlow's crc32c::Mask does.
    crc = 0xE3069283
    assert tfrecord.masked_crc(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_each_sample_exactly_once_per_epoch_whatever_the_workers(stored, workers):
    reader = datasets.reader(stored, SPEC)
    loader = torch.utils.data.DataLoader(_Indexed(reader), batch_size=5, shuffle=True, num_workers=workers,
                                         generator=torch.Generator().manual_seed(0))
    seen = [int(i) for batch, _ in loader for i in batch]
    assert sorted(seen) == list(range(SPEC.n_samples))  # none twice, none missing


class _Indexed(torch.utils.data.Dataset):
    """The reader's samples with the index each was read for, checked against the bytes."""

    def __init__(self, reader):
        self.reader = reader

    def __len__(self):
        return len(self.reader)

    def __getitem__(self, i):
        raw = self.reader.read_raw(i)
        assert np.array_equal(raw, datasets.sample_raw(self.reader.spec, i))
        return i, torch.from_numpy(raw.copy())


def _offsets(stored):
    return [int(line.split()[0]) for line in (stored / tfrecord.INDEX).read_text().splitlines()]


def test_a_flipped_byte_or_a_cut_short_file_fails_with_the_file_and_offset(stored):
    path = stored / tfrecord.FILE
    offsets = _offsets(stored)
    blob = bytearray(path.read_bytes())
    blob[offsets[7] + 20] ^= 0xFF  # inside record 7's data
    path.write_bytes(bytes(blob))
    reader = datasets.reader(stored, SPEC)
    assert np.array_equal(reader.read_raw(6), datasets.sample_raw(SPEC, 6))  # its neighbours still read
    with pytest.raises(tfrecord.CorruptRecordError, match=rf"{tfrecord.FILE}: record at byte offset "
                                                          rf"{offsets[7]}: the data's CRC does not match"):
        reader.read_raw(7)
    reader.close()
    path.write_bytes(bytes(blob[:offsets[-1] + 30]))  # the last record cut short
    with pytest.raises(tfrecord.CorruptRecordError, match=rf"offset {offsets[-1]}: cut short"):
        datasets.reader(stored, SPEC).read_raw(SPEC.n_samples - 1)
    with pytest.raises(tfrecord.CorruptRecordError, match=rf"offset {offsets[7]}: the data's CRC"):
        list(tfrecord.iter_records(path))  # a sequential read stops at the first bad record


def test_the_length_crc_guards_the_framing(stored):
    path = stored / tfrecord.FILE
    offset = _offsets(stored)[3]
    blob = bytearray(path.read_bytes())
    blob[offset:offset + 8] = struct.pack("<Q", 10**9)  # a wild length would read past the file
    path.write_bytes(bytes(blob))
    with pytest.raises(tfrecord.CorruptRecordError, match=rf"offset {offset}: the length's CRC does not match"):
        datasets.reader(stored, SPEC).read_raw(3)


@pytest.mark.slow  # a kernel and loader workers (perfkit run)
def test_a_corrupt_shard_fails_the_configuration_with_where_it_is(tmp_path):

    cache = tmp_path / "cache"
    path, _ = datasets.ensure(SPEC, cache)
    offsets = _offsets(path)
    blob = bytearray((path / tfrecord.FILE).read_bytes())
    blob[offsets[11] + 40] ^= 0x01
    (path / tfrecord.FILE).write_bytes(bytes(blob))
    out = tmp_path / "runs"
    params = {"format": "tfrecord", "n_samples": "48", "sample_bytes": "300", "seed": "3", "num_workers": "[2]",
              "batch_size": "8", "steps": "4", "loader_batches": "6", "step_compute_s": "0.001",
              "stall_attribution": "False", "device": "cpu", "cache_dir": str(cache)}
    ran = subprocess.run([sys.executable, "-m", "perfkit.cli", "run", str(REPO / "notebooks" / "dataloader.ipynb"),
                          "--out", str(out), *[a for k, v in params.items() for a in ("-p", k, v)]],
                         capture_output=True, text=True, timeout=300)
    import perfkit

    rows = perfkit.load(out)
    assert ran.returncode != 0 and set(rows["status"]) == {"failed"}, (ran.stdout, ran.stderr)
    error = " ".join(str(e) for e in rows["error"])
    assert f"{tfrecord.FILE}: record at byte offset {offsets[11]}: the data's CRC does not match" in error, error


def test_without_crc32c_the_format_is_refused_before_any_data_is_made(monkeypatch, tmp_path):
    from perfkit.core.errors import BadInputError

    monkeypatch.setitem(sys.modules, "crc32c", None)  # import crc32c now raises ImportError
    with pytest.raises(BadInputError, match=r"pip install 'perfkit\[tfrecord\]'"):
        datasets.DatasetSpec(format="tfrecord", n_samples=4)
    assert not (tmp_path / "cache").exists()


def test_two_ranks_of_two_workers_read_each_sample_exactly_once(stored):
    # Each rank's DistributedSampler shard, split again over its two workers: together every
    # sample once (48 samples divide evenly over 2 ranks, so no sample is repeated as padding).
    reader = datasets.reader(stored, SPEC)
    seen = []
    for rank in (0, 1):
        sampler = torch.utils.data.distributed.DistributedSampler(range(SPEC.n_samples), num_replicas=2, rank=rank,
                                                                  shuffle=True, seed=0)
        loader = torch.utils.data.DataLoader(_Indexed(reader), batch_size=4, sampler=sampler, num_workers=2)
        seen += [int(i) for batch, _ in loader for i in batch]
    assert sorted(seen) == list(range(SPEC.n_samples))
