"""TFRecord datasets without TensorFlow: the record framing with its CRCs, ``tf.train.Example``
protos, an index of record offsets, and a reader that checks every CRC it reads.

**Framing** (TensorFlow's ``tensorflow/core/lib/io/record_writer.cc``, documented in
"TFRecord and tf.train.Example"): each record is

    uint64 length | uint32 masked_crc32c(length) | byte data[length] | uint32 masked_crc32c(data)

little-endian, where ``masked_crc(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8`` (mod 2³²) of the
CRC-32C (Castagnoli) of the bytes: the ``crc32c`` package (C, the ``tfrecord`` extra).

**Payload**: a serialized ``tf.train.Example`` (``tensorflow/core/example/example.proto``) with
features ``index`` (an ``int64_list``) and ``data`` (a ``bytes_list`` of the sample's raw bytes),
written and parsed here by the protobuf wire format (the subset Example uses), so any TFRecord
reader (TensorFlow's, the ``tfrecord`` package, DALI) reads the files perfkit writes.

**Index**: ``data.tfrecord.index``, one line per record, ``<byte offset> <record bytes>``: the
``tfrecord`` package's index format, which is what makes random access (and a split of the records
over DataLoader workers without duplicates) possible; without it a record file can only be read
in order, and each worker that reads it returns every record (that package's own warning).

A CRC that does not match, a record cut short, or a record whose ``index`` is not the one the
index file promised raises :class:`CorruptRecordError` naming the file and the byte offset: a
configuration that reads a corrupt shard fails, it never delivers a short or wrong epoch.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from perfkit.core.errors import BadInputError
from perfkit.measuring.data.datasets import DatasetSpec, SampleDataset, sample_raw

__all__ = ["FILE", "INDEX", "CorruptRecordError", "masked_crc", "encode_example", "decode_example",
           "write", "read_record", "iter_records", "Reader", "check_available"]

FILE = "data.tfrecord"
INDEX = "data.tfrecord.index"
_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")  # length, masked CRC of the length's 8 bytes
_FOOTER = struct.Struct("<I")  # masked CRC of the data


class CorruptRecordError(ValueError):
    """A record that fails its framing's checks: the file and byte offset say where."""

    def __init__(self, path: Path, offset: int, what: str):
        super().__init__(f"{path}: record at byte offset {offset}: {what}")
        self.path, self.offset = path, offset


def check_available() -> None:
    """Raise :class:`BadInputError` (exit 2, before any data is generated) without ``crc32c``."""
    try:
        import crc32c  # noqa: F401
    except ImportError:
        raise BadInputError("format 'tfrecord' checks every record's CRC-32C with the crc32c package: "
                            "pip install 'perfkit[tfrecord]' (or crc32c)") from None


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C of ``data``."""
    import crc32c

    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


# ---- tf.train.Example, by the protobuf wire format -------------------------------------------------
# Example { Features features = 1; }  Features { map<string, Feature> feature = 1; }
# Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
# BytesList { repeated bytes value = 1; }  Int64List { repeated int64 value = 1 [packed = true]; }
# A map entry is a message { key = 1; value = 2; }. Wire types: 0 varint, 2 length-delimited.


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64: two's complement in ten bytes at most
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_example(features: dict[str, bytes | int]) -> bytes:
    """A serialized ``tf.train.Example``: bytes values as a ``bytes_list``, ints as an ``int64_list``."""
    entries = b""
    for key, value in features.items():
        if isinstance(value, (bytes, bytearray, memoryview)):
            feature = _field(1, _field(1, bytes(value)))
        else:
            feature = _field(3, _field(1, _varint(int(value))))
        entries += _field(1, _field(1, key.encode()) + _field(2, feature))
    return _field(1, entries)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(buf: memoryview):
    """(field number, wire type, value) of a message: varints as ints, length-delimited as views."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 2:
            size, pos = _read_varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire in (1, 5):  # fixed64, fixed32 (a float_list's values)
            size = 8 if wire == 1 else 4
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise ValueError(f"protobuf wire type {wire} is not one tf.train.Example uses")
        yield number, wire, value


def decode_example(data: bytes | memoryview) -> dict[str, bytes | list[int]]:
    """The ``bytes_list`` (first value) and ``int64_list`` features of a serialized Example."""
    out: dict[str, bytes | list[int]] = {}
    for number, _, features in _fields(memoryview(data)):
        if number != 1:
            continue
        for _, _, entry in _fields(features):
            key, feature = "", None
            for n, _, v in _fields(entry):
                key, feature = (bytes(v).decode(), feature) if n == 1 else (key, v)
            for kind, _, values in _fields(feature if feature is not None else memoryview(b"")):
                if kind == 1:  # bytes_list
                    out[key] = next((bytes(v) for n, _, v in _fields(values) if n == 1), b"")
                elif kind == 3:  # int64_list, packed (or not)
                    ints = []
                    for n, wire, v in _fields(values):
                        if wire == 2:
                            pos = 0
                            while pos < len(v):
                                x, pos = _read_varint(v, pos)
                                ints.append(x - (1 << 64) if x >> 63 else x)
                        else:
                            ints.append(v - (1 << 64) if v >> 63 else v)
                    out[key] = ints
    return out


# ---- files -----------------------------------------------------------------------------------------


def write(spec: DatasetSpec, root: Path) -> list[Path]:
    """``spec``'s samples as one TFRecord file and its index (a :mod:`.datasets` writer)."""
    path, index = root / FILE, root / INDEX
    with open(path, "wb") as f, open(index, "w") as idx:
        for i in range(spec.n_samples):
            data = encode_example({"index": i, "data": sample_raw(spec, i).tobytes()})
            length = struct.pack("<Q", len(data))
            record = length + struct.pack("<I", masked_crc(length)) + data + _FOOTER.pack(masked_crc(data))
            idx.write(f"{f.tell()} {len(record)}\n")
            f.write(record)
    return [path, index]


def read_record(f, path: Path, offset: int) -> tuple[bytes, int]:
    """The data of the record at ``offset`` of the open file ``f``, CRCs checked, and the offset
    of the next record."""
    f.seek(offset)
    header = f.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise CorruptRecordError(path, offset, f"cut short: {len(header)} of the header's {_HEADER.size} bytes")
    length, length_crc = _HEADER.unpack(header)
    if masked_crc(header[:8]) != length_crc:
        raise CorruptRecordError(path, offset, "the length's CRC does not match")
    body = f.read(length + _FOOTER.size)
    if len(body) < length + _FOOTER.size:
        raise CorruptRecordError(path, offset, f"cut short: {len(body)} of {length + _FOOTER.size} bytes after "
                                               "the header")
    data = body[:length]
    if masked_crc(data) != _FOOTER.unpack(body[length:])[0]:
        raise CorruptRecordError(path, offset, f"the data's CRC does not match ({length} bytes)")
    return data, offset + _HEADER.size + length + _FOOTER.size


def iter_records(path: str | Path):
    """Every record's data in file order, CRCs checked (a sequential read: no index needed)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        offset = 0
        while offset < size:
            data, offset = read_record(f, path, offset)
            yield data


def _load_index(path: Path) -> np.ndarray:
    try:
        table = np.loadtxt(path, dtype=np.int64, ndmin=2)
    except (OSError, ValueError) as e:
        raise BadInputError(f"{path}: not a TFRecord index ('<offset> <bytes>' per line): {e}") from None
    return table[:, 0]


class Reader(SampleDataset):
    """Random access to a TFRecord dataset through its index: one seek and one read per sample,
    both CRCs checked, and the record's own ``index`` feature checked against the one asked for."""

    def _open(self):
        return open(self.path / FILE, "rb", buffering=0), _load_index(self.path / INDEX)

    def close(self) -> None:
        if self._handle is not None and self._pid is not None:
            self._handle[0].close()
        self._handle = self._pid = None

    def read_raw(self, index: int) -> np.ndarray:
        f, offsets = self._opened()
        path = self.path / FILE
        offset = int(offsets[index])
        data, _ = read_record(f, path, offset)
        example = decode_example(data)
        if example.get("index") != [index]:
            raise CorruptRecordError(path, offset, f"holds sample {example.get('index')}, the index file says {index}")
        return np.frombuffer(example["data"], dtype=np.uint8)
