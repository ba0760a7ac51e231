"""The start-of-run listing of the chain says where each callback runs."""
from torchstage import CSVLogger, EvenBatchesCallback, HangWatchdog, LoopCallback
from torchstage.runner.chain import describe_chain


def test_listing_names_main_rank_callbacks_and_those_of_every_rank_of_a_distributed_run():
    lines = describe_chain({"loop": LoopCallback(), "watchdog": HangWatchdog(), "even_batches": EvenBatchesCallback(),
                            "csv": CSVLogger()}).splitlines()
    where = {line.split()[1]: line for line in lines}
    assert where["loop"].endswith("LoopCallback")  # every rank: nothing added
    assert where["csv"].endswith("CSVLogger (main rank only)")
    for name in ("watchdog", "even_batches"):  # every rank of a run of several processes, never the main one alone
        assert "main rank" not in where[name] and where[name].endswith("(every rank, several processes only)")
