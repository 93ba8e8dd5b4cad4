"""caf_hvd.data: the small part of Ray Data a training loop reads from, for in-memory
datasets: from_items, then per rank get_dataset_shard(name).iter_torch_batches(...).
The items travel to every rank with the loop; each rank reads items rank, rank + size,
... (Ray Data splits a dataset into equal shares among the workers too)."""


def from_items(items):
    """A dataset of the given rows (dicts, or plain values stored as {"item": value})."""
    rows = [r if isinstance(r, dict) else {"item": r} for r in items]
    return Dataset(rows)


class Dataset:
    def __init__(self, rows):
        self._rows = list(rows)

    def count(self):
        return len(self._rows)

    def take(self, limit=20):
        return [dict(r) for r in self._rows[:limit]]

    def take_all(self):
        return [dict(r) for r in self._rows]

    def shard(self, index, count):
        return Dataset(self._rows[index::count])

    def iter_rows(self):
        for r in self._rows:
            yield dict(r)

    def iter_batches(self, *, batch_size=256, drop_last=False):
        """Batches as dicts of column lists."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}")
        for start in range(0, len(self._rows), batch_size):
            chunk = self._rows[start:start + batch_size]
            if drop_last and len(chunk) < batch_size:
                return
            yield {k: [r[k] for r in chunk] for k in chunk[0]}

    def iter_torch_batches(self, *, batch_size=256, dtypes=None, device=None,
                           drop_last=False):
        """Batches as dicts of torch tensors (dtypes: one dtype, or one per column)."""
        import torch
        for batch in self.iter_batches(batch_size=batch_size, drop_last=drop_last):
            out = {}
            for k, v in batch.items():
                dtype = dtypes.get(k) if isinstance(dtypes, dict) else dtypes
                out[k] = torch.as_tensor(v, dtype=dtype, device=device)
            yield out
