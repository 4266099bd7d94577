"""A look at a request's protobuf wire format for what the decoder does not say: which string
field holds bytes that are not UTF-8. The decoder refuses the whole request ("String field had
bad UTF-8"), and a caller with a request of many fields and items had to guess which one."""

from __future__ import annotations

from typing import Any

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5
# Fields looked at before giving up: the walk runs on the event loop (gRPC decodes requests
# there), and a 60 MB request of tiny fields held it 11 s, before any token was checked.
MAX_FIELDS_WALKED = 10_000


class _Budget:
    def __init__(self) -> None:
        self.fields = MAX_FIELDS_WALKED


def undecodable_string_field(descriptor: Any, data: bytes, prefix: str = "") -> str | None:
    """The path (`items[2].message_json`) of the first string field of `data`, a serialized
    message of `descriptor`, whose bytes are not UTF-8; None when there is none, or the data is
    not well formed enough to tell, or it holds more than MAX_FIELDS_WALKED fields before it."""
    try:
        return _walk(descriptor, memoryview(data), prefix, _Budget())
    except IndexError:  # cut short inside a tag or a length, or past the budget
        return None


def _walk(descriptor: Any, data: memoryview, prefix: str, budget: _Budget) -> str | None:
    position, seen = 0, dict[int, int]()
    while position < len(data):
        budget.fields -= 1
        if budget.fields < 0:
            raise IndexError("past the fields walked")
        key, position = _varint(data, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            _, position = _varint(data, position)
        elif wire_type == _FIXED64:
            position += 8
        elif wire_type == _FIXED32:
            position += 4
        elif wire_type == _LENGTH_DELIMITED:
            length, position = _varint(data, position)
            value, position = data[position : position + length], position + length
            field = descriptor.fields_by_number.get(number)
            if field is None:
                continue
            index = seen.get(number, 0)
            seen[number] = index + 1
            name = f"{prefix}{field.name}" + (f"[{index}]" if field.is_repeated else "")
            if field.type == field.TYPE_STRING:
                try:
                    bytes(value).decode("utf-8")
                except UnicodeDecodeError:
                    return name
            elif field.type == field.TYPE_MESSAGE:
                found = _walk(field.message_type, value, name + ".", budget)
                if found is not None:
                    return found
        else:  # groups, or not protobuf at all
            return None
    return None


def _varint(data: memoryview, position: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")
