// What the allocator did across one cell, as a ledger row gives it per device of the kernel
// (`DeviceCellUsage`, ./protocol) and per worker process (`WorkerCellUsage`, ./worker_rows):
// one list of figures, so the two cannot name them differently. Mirrors
// gpumem_widget/wire/cell_usage.py (`DeviceCellUsage`).

/** Bytes, and counts for retries and OOMs. */
export interface CellUsageFigures {
  allocated_before: number;
  allocated_after: number;
  reserved_before: number;
  reserved_after: number;
  peak_allocated: number;
  peak_reserved: number;
  peak_exact: boolean; // false: the peaks are lower bounds (passive peak mode)
  alloc_retries: number;
  ooms: number;
  delta_allocated: number;
}
