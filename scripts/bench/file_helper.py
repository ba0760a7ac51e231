"""The helper process of ``overhead_writer.py``'s ``helper process`` contender: runs file operations it reads from
stdin (length-prefixed pickles, in order) with torchstage's own writers, and answers each ``ping`` with a line.

A measurement, not a design: it shows what the file jobs cost when their system calls run in an interpreter of
their own, so that none of them hands the training process's GIL back and forth.
"""
import pickle
import struct
import sys

from torchstage.files.atomic import write_atomic_copies, write_atomic_stream
from torchstage.files.log_files import LogFiles


def main():
    source, answers, files = sys.stdin.buffer, sys.stdout.buffer, LogFiles()
    # the jobs the run would hand to its writer thread, as that thread runs them
    operations = {"copies": write_atomic_copies, "stream": write_atomic_stream, "append": files._append,
                  "replace": files._replace, "close": files._close_all}
    while True:
        head = source.read(4)
        if len(head) < 4:
            return
        op, *args = pickle.loads(source.read(struct.unpack("<I", head)[0]))
        if op == "ping":
            answers.write(b"\n")
            answers.flush()
        else:
            operations[op](*args)


if __name__ == "__main__":
    main()
