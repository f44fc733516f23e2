"""The public entry point: :func:`open`, which takes the options and returns the stream (or the pair of them).

``h5stream.open`` is this function; :class:`~h5stream.streaming.stream.Stream` is what it returns.
"""

from __future__ import annotations

import inspect
import os

from h5stream.errors import ConfigError
from h5stream.order.split import BOTH
from h5stream.streaming.options import StreamOptions
from h5stream.streaming.stream import Stream


def open(path: str | os.PathLike, *args, **kwargs) -> Stream:  # noqa: A001 - mirrors h5py.File / builtins.open
    """Open a store for streaming: ``Stream(path, StreamOptions(...))``.  See :class:`Stream` for what it yields.

    The same options give the same batches, with 0, 1 or N workers, in a
    feeder process or not, from a local file or its URL; docs/design.md
    ("Options of open") explains each option at length.

    Args:
        path: the store (``OUT.h5``), or a URL: ``s3://bucket/key`` or
            ``http(s)://host/path`` (a server that honours ``Range``); or a
            set of part stores read as one: a list of them, a glob
            (``"parts/*.h5"``) or a manifest (``parts.json``, docs/parts.md).
        batch_size: rows per batch; the last batch of an epoch may be smaller
            unless ``drop_remainder=True``.
        memory_budget: bytes (or ``"512MB"``, ``"1.5GiB"``) that bound
            everything the stream allocates, workers included.  None: 256 MiB
            for reading and shuffling plus what the workers need on top, so any
            worker count runs with the same order (``stream.plan.describe()``).
        shuffle: reshuffle every epoch (default: True, False for
            ``subset="validation"``).
        seed: fixes the order (None draws one, recorded in ``state()``).
        drop_remainder: drop the last, smaller batch of each epoch (of each shard).
        shard: ``(index, count)``: one of ``count`` disjoint parts of every
            epoch, for data-parallel training.
        resume: a dict from :meth:`Stream.state`: continue exactly where it was taken.  The options
            that shape the order (``seed``, ``batch_size``, ``shuffle``, ``drop_remainder``,
            ``rows_per_fill``, ``read_unit``, ``piece_bytes``) are the state's when left out (or None);
            one given that differs from the state is a :class:`~h5stream.ConfigError`.
        augment: an :class:`~h5stream.Augment` applied to every batch.
        workers: spawned processes that augment the batches, or without
            ``augment`` read them (copy the rows into shared memory the
            batches are lent from); 0: in the consumer's thread.
        rows_per_fill: the shuffle window in rows (default: what the budget
            leaves); pass it to get the same batches under any budget that holds it.
        timeout_s: seconds to wait for a batch before raising :class:`~h5stream.ReaderError`.
        validation_split: the fraction of rows, the last ones of the store,
            that form the validation subset (Keras' convention; the store must
            be in shuffled storage order, a set of parts one ``ingest --part``
            set).
        subset: ``"training"``, ``"validation"`` or ``"both"`` (returns the pair;
            an ``augment`` with a random resized crop gives the validation
            stream its centre crop, :meth:`Augment.evaluation`).
        label_mode: ``"int"`` (labels as stored), ``"categorical"`` (one-hot
            float32), ``"binary"`` (float32 ``(n, 1)``, two classes) or None
            (batches are the images alone, for ``model.predict``).
        remote: an :class:`h5stream.RemoteOptions` or a dict of its fields
            (``endpoint``, ``region``, ``profile``, ``anonymous``, ``timeout_s``,
            ``max_in_flight``, ``headers``, ``cache_piece``: bytes or ``"8MiB"``)
            for a URL.
        cache_dir: for a URL, the folder of the local disk cache that keeps
            what was fetched for later epochs, other processes and later runs
            (``"auto"``: ``$XDG_CACHE_HOME/h5stream`` or ``~/.cache/h5stream``;
            None or False: no cache, every epoch from the server).
        cache_limit: bytes (or ``"100GB"``, the default) the cache folder may
            hold; the least recently used pieces are removed past it.
        direct_io: read past the page cache (``O_DIRECT``): ``"auto"`` for a
            store larger than the memory that could cache it, True, False.
            A set of parts counts its local parts together and reads each
            local part whose file system takes ``O_DIRECT`` so.
        read_unit: bytes (or ``"4MiB"``) that rows move between fills in, and
            the size of most reads (default 1 to 4 MiB); changes the order.
        piece_bytes: the two-level order (e.g. ``"8MiB"``): the store is cut
            into pieces of whole blocks of at least this size, permuted per
            epoch, and the ``read_unit`` units shuffled within a window of
            pieces; a URL fetches each piece with one large ranged request, once
            per epoch.  A local file opened with the same value yields the
            same batches.  Default None: the one-level order.
        verify_reads: check the rows read against the store's checksums (each
            row against its own digest where the store keeps them, else its
            block's): ``"once"`` (each row or block on its first read; labels
            always), True (every read), False.
        feeder: run the reader and the workers' bookkeeping in a feeder
            process (needs ``workers > 0``, with or without ``augment``); the
            training process keeps no h5stream thread and takes one small
            message per batch.
        allow_unfinished: stream a store whose ingest did not finish without
            the one ``UserWarning`` (naming the counts and the command that
            finishes it) that ``open`` gives otherwise.

    Returns:
        A :class:`Stream`, or ``(training, validation)`` with ``subset="both"``.

    Raises:
        StoreNotFoundError: no file (or object) at ``path``.
        StorePermissionError: the file (or object) may not be read by this user (or these credentials).
        StoreFormatError: the file is not a store h5stream can stream.
        StoreBusyError: a writer at work on the store never let its metadata be read whole.
        ConfigError: an option that does not fit the store, or each other.
        OptionNameError: a keyword that names no option (a ``TypeError`` too); the message names the
            option meant, Keras' and torch's names included.
        StorePathError: ``path`` is not a path, a URL or a list of them (a ``TypeError`` too).
        BudgetError: a memory budget (or machine) that cannot hold the plan;
            the message names the budget, workers or batch size that fit.
        ResourceLimitError: a process limit (open files, a file size limit)
            too low to start the stream; the message names the limit.
        MissingDependencyError: a URL without the ``[remote]`` extra installed.
        RemoteUnavailableError: a URL whose server did not answer within ``remote``'s ``timeout_s``.

    Every error class is ``h5stream.<Name>`` and also subclasses the builtin it
    resembles (``ValueError``, ``OSError``, ...); messages are one line.
    """
    options = StreamOptions(*args, **kwargs)
    if options.subset != BOTH:
        return Stream(path, options)
    if options.resume is not None:
        raise ConfigError("resume= with subset='both': a state belongs to one subset; open each subset with "
                          "subset='training' / 'validation' and its own resume=")
    training = Stream(path, options.changed(subset="training"))
    try:
        evaluation = getattr(options.augment, "evaluation", None)  # torchvision's crops: centred (else as given)
        augment = options.augment if evaluation is None else evaluation()
        validation = Stream(path, options.changed(subset="validation", allow_unfinished=True, augment=augment))
    except BaseException:
        training.close()
        raise
    return training, validation


open.__signature__ = inspect.Signature(
    [inspect.Parameter("path", inspect.Parameter.POSITIONAL_OR_KEYWORD),
     *inspect.signature(StreamOptions).parameters.values()],
    return_annotation="Stream | tuple[Stream, Stream]",
)
