-- tests/compat/sqlite.txt: a table of 200,000 rows built, indexed, queried, updated, deleted from.
create table t(id integer primary key, k integer, v text);
with recursive c(i) as (select 1 union all select i+1 from c where i < 200000)
insert into t select i, i*7919 % 1000, 'v' || i from c;
create index tk on t(k);
select k, count(*), sum(id), max(v) from t where k < 5 group by k;
select count(*), sum(length(v)) from t;
update t set v = v || 'x' where k % 3 = 0;
select count(*) from t where v like '%x';
delete from t where k > 900;
select count(*), sum(k) from t;
