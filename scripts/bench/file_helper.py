"""The helper process of ``overhead_writer.py``'s ``helper process`` contender: runs file operations it reads from
stdin (length-prefixed pickles, in order) with torchstage's own writers, and answers each ``ping`` with a line.

A measurement, not a design: it shows what the file jobs cost when their system calls run in an interpreter of
their own, so that none of them hands the training process's GIL back and forth.
"""
import os
import pickle
import struct
import sys

from torchstage.checkpoint import write_atomic, write_atomic_copies


def main():
    source, answers, files = sys.stdin.buffer, sys.stdout.buffer, {}
    while True:
        head = source.read(4)
        if len(head) < 4:
            return
        op, *args = pickle.loads(source.read(struct.unpack("<I", head)[0]))
        if op == "copies":
            write_atomic_copies(*args)
        elif op == "replace":  # path, data, durable
            old = files.pop(args[0], None)
            if old is not None:
                old.close()
            write_atomic(*args)
        elif op == "append":  # path, data
            file = files.get(args[0])
            if file is None:
                os.makedirs(os.path.dirname(args[0]), exist_ok=True)
                file = files[args[0]] = open(args[0], "ab")
            file.write(args[1])
            file.flush()
        elif op == "close":
            for file in files.values():
                file.close()
            files.clear()
        elif op == "ping":
            answers.write(b"\n")
            answers.flush()


if __name__ == "__main__":
    main()
