"""Memory the pipeline shares and lends: POSIX shared-memory arrays, memory lent out as batch arrays (reclaimed by
weak reference), aligned buffers and the preadv loop into them."""
