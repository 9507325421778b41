// The peer of `twopc bench --backend postgres --peer bitronix` (docs/benchmarks.md): the same
// transfer as the twopc side (debit one of 1000 accounts in one database, credit one in the
// other) as one XA transaction through Bitronix, a Java transaction manager, with pgjdbc's XA
// data source on both databases.
//
// A plain Java program with no build tool: the bench writes this file out, compiles it with
// javac and runs it on Debian's jars (libbtm-java, libgeronimo-jta-1.2-spec-java,
// libpostgresql-jdbc-java, libslf4j-java).
//
// Usage: java Transfer JOURNAL_DIR JDBC_URL_A JDBC_URL_B USER
//   (the password, if any, in the environment variable TWOPC_BENCH_PG_PASSWORD, so that it is
//   not on the command line for `ps` to show).
// It configures Bitronix, runs a JVM warm-up (2 s at concurrency 4, not reported), prints
// {"ready":true}, then reads cells from stdin, one per line: "CONCURRENCY WARMUP_S SECONDS".
// For each it opens two connection pools of CONCURRENCY sessions, runs CONCURRENCY workers in a
// closed loop for WARMUP_S unmeasured then SECONDS measured, closes the pools and prints one
// JSON line of results. End of input shuts the transaction manager down.

import bitronix.tm.BitronixTransactionManager;
import bitronix.tm.Configuration;
import bitronix.tm.TransactionManagerServices;
import bitronix.tm.resource.jdbc.PoolingDataSource;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.util.Arrays;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicReference;

import javax.transaction.Status;

public final class Transfer {
    static final int ACCOUNTS = 1000;
    static final String DEBIT =
        "UPDATE accounts SET balance = balance - 1 WHERE id = ? AND balance >= 1";
    static final String CREDIT = "UPDATE accounts SET balance = balance + 1 WHERE id = ?";

    static String urlA;
    static String urlB;
    static String user;
    static String password;
    static int pools;

    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: Transfer JOURNAL_DIR JDBC_URL_A JDBC_URL_B USER");
            System.exit(2);
        }
        urlA = args[1];
        urlB = args[2];
        user = args[3];
        password = System.getenv("TWOPC_BENCH_PG_PASSWORD");

        // Bitronix's defaults except where named: the disk journal (the default) in our own
        // directory, forced writes on (the default, set so that it is visible) with their
        // batching (the default group commit of the journal), 60 s transaction timeout,
        // background recovery every 60 s, JMX registration on.
        Configuration conf = TransactionManagerServices.getConfiguration();
        conf.setServerId("twopc-bench");
        conf.setJournal("disk");
        conf.setLogPart1Filename(args[0] + "/btm1.tlog");
        conf.setLogPart2Filename(args[0] + "/btm2.tlog");
        conf.setForcedWriteEnabled(true);
        conf.setForceBatchingEnabled(true);
        BitronixTransactionManager tm = TransactionManagerServices.getTransactionManager();

        // The JIT compiles the hot paths here, not in the first measured cell.
        runCell(tm, 4, 0.0, 2.0);
        System.out.println("{\"ready\":true}");
        System.out.flush();

        BufferedReader in =
            new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] parts = line.trim().split("\\s+");
            if (parts.length != 3) {
                System.err.println("bad cell line: " + line);
                System.exit(2);
            }
            String result = runCell(
                tm,
                Integer.parseInt(parts[0]),
                Double.parseDouble(parts[1]),
                Double.parseDouble(parts[2]));
            System.out.println(result);
            System.out.flush();
        }
        tm.shutdown();
    }

    /** One pool of `size` XA sessions on one database; unique names, as Bitronix requires. */
    static PoolingDataSource pool(String url, int size) {
        PoolingDataSource ds = new PoolingDataSource();
        ds.setUniqueName("bench" + (pools++));
        ds.setClassName("org.postgresql.xa.PGXADataSource");
        ds.setMinPoolSize(0);
        ds.setMaxPoolSize(size);
        ds.getDriverProperties().setProperty("url", url);
        ds.getDriverProperties().setProperty("user", user);
        if (password != null && !password.isEmpty()) {
            ds.getDriverProperties().setProperty("password", password);
        }
        ds.init();
        return ds;
    }

    /** What one worker counted. */
    static final class Tally {
        long committed;
        long committedAll;
        long failed;
        long[] latencies = new long[1024];
        int n;

        void latency(long nanos) {
            if (n == latencies.length) {
                latencies = Arrays.copyOf(latencies, n * 2);
            }
            latencies[n++] = nanos;
        }
    }

    static String runCell(BitronixTransactionManager tm, int concurrency, double warmup,
                          double seconds) throws Exception {
        PoolingDataSource a = pool(urlA, concurrency);
        PoolingDataSource b = pool(urlB, concurrency);
        AtomicReference<String> firstError = new AtomicReference<>();
        Tally[] tallies = new Tally[concurrency];
        Thread[] workers = new Thread[concurrency];
        final Flags flags = new Flags();
        for (int i = 0; i < concurrency; i++) {
            Tally tally = new Tally();
            tallies[i] = tally;
            workers[i] = new Thread(() -> {
                ThreadLocalRandom rng = ThreadLocalRandom.current();
                while (!flags.stop) {
                    String from = "a" + rng.nextInt(ACCOUNTS);
                    String to = "a" + rng.nextInt(ACCOUNTS);
                    long started = System.nanoTime();
                    boolean ok = transfer(tm, a, b, from, to, firstError);
                    long took = System.nanoTime() - started;
                    if (ok) {
                        tally.committedAll++;
                    }
                    if (flags.measuring) {
                        if (ok) {
                            tally.committed++;
                            tally.latency(took);
                        } else {
                            tally.failed++;
                        }
                    }
                }
            });
            workers[i].start();
        }
        Thread.sleep((long) (warmup * 1000));
        flags.measuring = true;
        long measureStart = System.nanoTime();
        Thread.sleep((long) (seconds * 1000));
        flags.measuring = false;
        long elapsed = System.nanoTime() - measureStart;
        flags.stop = true;
        for (Thread w : workers) {
            w.join();
        }
        a.close();
        b.close();

        long committed = 0, committedAll = 0, failed = 0;
        int total = 0;
        for (Tally t : tallies) {
            committed += t.committed;
            committedAll += t.committedAll;
            failed += t.failed;
            total += t.n;
        }
        long[] all = new long[total];
        int at = 0;
        for (Tally t : tallies) {
            System.arraycopy(t.latencies, 0, all, at, t.n);
            at += t.n;
        }
        Arrays.sort(all);
        String error = firstError.get();
        return "{\"concurrency\":" + concurrency
            + ",\"committed\":" + committed
            + ",\"committed_all\":" + committedAll
            + ",\"failed\":" + failed
            + ",\"p50_ms\":" + quantileMs(all, 0.50)
            + ",\"p99_ms\":" + quantileMs(all, 0.99)
            + ",\"elapsed_s\":" + (elapsed / 1e9)
            + ",\"first_error\":" + (error == null ? "null" : jsonString(error))
            + "}";
    }

    static final class Flags {
        volatile boolean measuring;
        volatile boolean stop;
    }

    /** begin; debit at A; credit at B; commit (two-phase: both are XA resources). */
    static boolean transfer(BitronixTransactionManager tm, PoolingDataSource a,
                            PoolingDataSource b, String from, String to,
                            AtomicReference<String> firstError) {
        try {
            tm.begin();
            try {
                update(a, DEBIT, from);
                update(b, CREDIT, to);
            } catch (Exception e) {
                tm.rollback();
                throw e;
            }
            tm.commit();
            return true;
        } catch (Exception e) {
            firstError.compareAndSet(null, e.toString());
            try {
                if (tm.getStatus() != Status.STATUS_NO_TRANSACTION) {
                    tm.rollback();
                }
            } catch (Exception ignored) {
                // The transaction is over either way; the failure is already counted.
            }
            return false;
        }
    }

    static void update(PoolingDataSource ds, String sql, String id) throws Exception {
        try (Connection c = ds.getConnection(); PreparedStatement s = c.prepareStatement(sql)) {
            s.setString(1, id);
            int rows = s.executeUpdate();
            if (rows != 1) {
                throw new IllegalStateException(sql + " for " + id + " touched " + rows + " rows");
            }
        }
    }

    /** The same rank as the Rust side's `latency::quantile`, in ms; null when empty. */
    static String quantileMs(long[] sorted, double q) {
        if (sorted.length == 0) {
            return "null";
        }
        int rank = (int) Math.ceil(q * sorted.length) - 1;
        rank = Math.max(0, Math.min(sorted.length - 1, rank));
        return Double.toString(sorted[rank] / 1e6);
    }

    static String jsonString(String s) {
        StringBuilder out = new StringBuilder("\"");
        for (char ch : s.toCharArray()) {
            if (ch == '"' || ch == '\\') {
                out.append('\\').append(ch);
            } else if (ch < 0x20) {
                out.append(String.format("\\u%04x", (int) ch));
            } else {
                out.append(ch);
            }
        }
        return out.append('"').toString();
    }
}
