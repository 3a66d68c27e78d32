// The browser's part of the ledger: the kernel keeps every record; the widget carries the newest
// ones (a window), a band per cell for the chart, and the pages the user asked for (scrolling
// back, or selecting a band whose record is not here). Records are kept by their index in the
// kernel's ledger, so a page and the window join without duplicates.

import { bandOf, type Band, type BrowserMessage, type CellRecord, type CellsPage, type LedgerExtent } from "../wire/protocol";

export const PAGE_SIZE = 200;

export class LedgerStore {
  private extent: LedgerExtent = { total: 0, first: 0, bands_first: 0, epoch: 0 };
  private window: CellRecord[] = [];
  private tableBands: Band[] = [];
  private readonly pages = new Map<number, CellRecord>(); // index -> record, before the window
  private joined: CellRecord[] | null = null;
  private joinedBands: Band[] | null = null;

  /** The window (`cells` + `cells_tail`) and what the kernel says of the rest. */
  setWindow(extent: LedgerExtent, records: CellRecord[]): void {
    if (extent.epoch !== this.extent.epoch) this.pages.clear(); // the ledger was cleared
    this.extent = extent;
    this.window = records;
    this.joined = null;
    this.joinedBands = null;
  }

  setBands(bands: Band[]): void {
    this.tableBands = bands;
    this.joinedBands = null;
  }

  /** Keep a page's records that the window does not hold; false if it is from a cleared ledger. */
  addPage(page: Extract<CellsPage, { first: number }>): boolean {
    if (page.epoch !== this.extent.epoch) return false;
    page.records.forEach((r, i) => {
      const index = page.first + i;
      if (index < this.extent.first) this.pages.set(index, r);
    });
    this.joined = null;
    return true;
  }

  get total(): number {
    return this.extent.total;
  }

  /** Every record here, oldest first: the pages asked for, then the window. */
  get cells(): CellRecord[] {
    if (this.joined === null) {
      const older = [...this.pages.entries()].sort((a, b) => a[0] - b[0]).map(([, r]) => r);
      this.joined = [...older, ...this.window];
    }
    return this.joined;
  }

  /** One band per cell the widget knows of: the band table, then the window's newer records. */
  get bands(): Band[] {
    if (this.joinedBands === null) {
      const tableEnd = this.extent.bands_first + this.tableBands.length;
      const newer = this.window.filter((_, i) => this.extent.first + i >= tableEnd).map(bandOf);
      // A window older than the table's end (a kernel without `cell_bands`): its own bands.
      this.joinedBands = this.tableBands.length > 0 ? [...this.tableBands, ...newer] : this.window.map(bandOf);
    }
    return this.joinedBands;
  }

  find(executionCount: number): CellRecord | undefined {
    return this.cells.find((c) => c.execution_count === executionCount);
  }

  /** How many older records are neither in the window nor in a page, counting down from the
   * window without a gap (what "load older" would fetch next). */
  get olderMissing(): number {
    let i = this.extent.first;
    while (i > 0 && this.pages.has(i - 1)) i--;
    return i;
  }

  /** The request for the next older page; null when every older record is here. */
  olderRequest(): BrowserMessage | null {
    const before = this.olderMissing;
    return before > 0 ? { type: "cells_page", before, limit: PAGE_SIZE } : null;
  }
}

/** The request for the page that ends with one cell (a band selected whose record is not here). */
export function cellRequest(executionCount: number): BrowserMessage {
  return { type: "cells_page", execution_count: executionCount, limit: 20 };
}
