"""Reads a TensorBoard event file with TensorBoard's own readers and prints what they saw as
JSON, for tests/tracking/test_tracking.cpp to compare with what Ember logged.

    python read_tensorboard.py <event file>

Prints one object:
  "events":  every record, read by event_file_loader.RawEventFileLoader (which checks both
             CRCs of every record) and parsed as tensorflow.Event:
             {"wall_time", "step", "file_version", "scalars": [[tag, float32 bits]],
              "texts": [[tag, plugin name, text]]}
  "scalars": what EventAccumulator (the reader behind TensorBoard's scalar dashboard) reports,
             {tag: [[step, wall_time, float32 bits]]}
  "texts":   EventAccumulator's tensors: {tag: [[step, text]]}
Float values are given as the bits of the float32 so NaN and infinities compare exactly.
"""
import json
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator, event_file_loader
from tensorboard.compat.proto import event_pb2


def float32_bits(value):
    return struct.unpack("<I", struct.pack("<f", value))[0]


def raw_events(path):
    out = []
    for record in event_file_loader.RawEventFileLoader(path).Load():
        event = event_pb2.Event.FromString(record)
        entry = {"wall_time": event.wall_time, "step": event.step, "file_version": event.file_version,
                 "scalars": [], "texts": []}
        for value in event.summary.value:
            if value.HasField("simple_value"):
                entry["scalars"].append([value.tag, float32_bits(value.simple_value)])
            if value.HasField("tensor"):
                entry["texts"].append([value.tag, value.metadata.plugin_data.plugin_name,
                                       b"".join(value.tensor.string_val).decode("utf-8")])
        out.append(entry)
    return out


def accumulated(path):
    acc = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.SCALARS: 0,
                                                                  event_accumulator.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = {tag: [[e.step, e.wall_time, float32_bits(e.value)] for e in acc.Scalars(tag)]
               for tag in tags[event_accumulator.SCALARS]}
    texts = {tag: [[e.step, b"".join(e.tensor_proto.string_val).decode("utf-8")] for e in acc.Tensors(tag)]
             for tag in tags[event_accumulator.TENSORS]}
    return scalars, texts


def main():
    path = sys.argv[1]
    scalars, texts = accumulated(path)
    json.dump({"events": raw_events(path), "scalars": scalars, "texts": texts}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
