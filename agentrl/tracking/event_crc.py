"""The masked CRC-32C of TensorBoard's event records, in numpy instead of a Python loop over the bytes.

Without TensorFlow installed, TensorBoard's writer checksums each record a byte at a time in Python: about 0.1 ms a
kilobyte, and a step's scalars are one or two kilobytes. A CRC is linear over GF(2): the register after a message is
the XOR of each byte's own contribution, which depends only on the byte and on how many bytes follow it, plus a
constant for the message's length. `masked_crc32c` looks both up in tables built once (4 MiB for records up to 4 KiB)
and leaves longer records to TensorBoard's own function.
"""

from __future__ import annotations

import numpy as np

POLYNOMIAL = 0x82F63B78  # CRC-32C (Castagnoli), bit-reflected
MAX_TABLE_BYTES = 4096  # longer records (sample texts) go to TensorBoard's own function
SHORT = 32  # shorter ones too: below this a Python loop costs less than the numpy calls
MASK_DELTA = 0xA282EAD8


def _byte_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(POLYNOMIAL), table >> 1).astype(np.uint32)
    return table


class _Tables:
    def __init__(self, length: int):
        byte = _byte_table()
        self.byte = [int(value) for value in byte]

        def zero_byte(register: np.ndarray) -> np.ndarray:  # the register after one more byte of 0
            return byte[register & 0xFF] ^ (register >> 8)

        # by_distance[d, b]: what byte b contributes when d bytes follow it
        self.by_distance = np.empty((length, 256), dtype=np.uint32)
        self.by_distance[0] = byte
        for distance in range(1, length):
            self.by_distance[distance] = zero_byte(self.by_distance[distance - 1])
        self.flat = self.by_distance.reshape(-1)
        # start[n]: the register after n bytes of 0 from the initial 0xFFFFFFFF, final XOR applied
        start = np.empty(length + 1, dtype=np.uint32)
        register = np.array([0xFFFFFFFF], dtype=np.uint32)
        for n in range(length + 1):
            start[n] = register[0] ^ 0xFFFFFFFF
            register = zero_byte(register)
        self.start = start
        # the flat index of the first byte of an n-byte message is (n - 1) * 256; each later byte 256 less
        self.offsets = np.arange(length, dtype=np.int64) * -256


_tables: _Tables | None = None


def _crc32c_loop(data: bytes, byte: list[int]) -> int:
    register = 0xFFFFFFFF
    for value in data:
        register = byte[(register ^ value) & 0xFF] ^ (register >> 8)
    return register ^ 0xFFFFFFFF


def crc32c(data: bytes) -> int:
    global _tables
    if _tables is None:
        _tables = _Tables(MAX_TABLE_BYTES)
    length = len(data)
    if length < SHORT:
        return _crc32c_loop(data, _tables.byte)
    positions = _tables.offsets[:length] + ((length - 1) * 256)
    positions += np.frombuffer(data, dtype=np.uint8)
    return int(np.bitwise_xor.reduce(_tables.flat[positions])) ^ int(_tables.start[length])


def masked_crc32c(data: bytes) -> int:
    if len(data) > MAX_TABLE_BYTES:
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as one_byte_at_a_time

        return one_byte_at_a_time(data)
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


def install() -> None:
    """TensorBoard's record writer (torch's SummaryWriter's) computes its checksums here."""
    import tensorboard.summary.writer.record_writer as record_writer

    record_writer.masked_crc32c = masked_crc32c
