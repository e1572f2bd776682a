
document.querySelectorAll('table.sortable th').forEach(function (th) {
  th.title = 'click to sort';
  th.addEventListener('click', function () {
    var body = th.closest('table').tBodies[0], i = th.cellIndex, asc = th.dataset.dir !== 'asc';
    th.dataset.dir = asc ? 'asc' : 'desc';
    function key(row) {
      var c = row.cells[i], t = c.dataset.v !== undefined ? c.dataset.v : c.textContent, x = parseFloat(t);
      return isNaN(x) ? [1, t] : [0, x];
    }
    Array.from(body.rows).sort(function (a, b) {
      var x = key(a), y = key(b);
      if (x[0] !== y[0]) return x[0] - y[0];
      return (x[1] < y[1] ? -1 : x[1] > y[1] ? 1 : 0) * (asc ? 1 : -1);
    }).forEach(function (row) { body.appendChild(row); });
  });
});
