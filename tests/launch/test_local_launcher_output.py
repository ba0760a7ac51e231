"""The launcher's relay of worker output: rank prefixes, and no bare ``[rankN]: `` line for a blank one."""
import io
import os

from torchstage.launch.local_launcher import _relay


def test_blank_lines_are_not_relayed_as_bare_rank_prefixes():
    read, write = os.pipe()
    os.write(write, b"epoch 1\n\n\r\n[rank1]: already prefixed\n   \nlast\n")
    os.close(write)
    out, tail = io.StringIO(), []
    _relay(os.fdopen(read, "rb"), out, "[rank1]: ", tail)
    assert out.getvalue() == "[rank1]: epoch 1\n[rank1]: already prefixed\n[rank1]: last\n"
