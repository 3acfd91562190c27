#!/usr/bin/perl
# tests/compat/perl.txt: perl forking children that compute and report through pipes,
# waitpid and their exit statuses, system() and a backtick command. The output is fixed.
# An argument N repeats it all N times (the attach records need a perl that works a while).
use strict;
use warnings;

my $rounds = shift // 1;
for my $round (1 .. $rounds) {
    my %kids;
    for my $k (1 .. 4) {
        pipe(my $r, my $w) or die "pipe: $!";
        my $pid = fork() // die "fork: $!";
        if ($pid == 0) {
            close $r;
            my ($s, %h) = (0);
            for my $i (1 .. 60000) { $s += $i * $k % 7; $h{ $i % 97 } .= 'x' if $i % 13 == 0; }
            print $w "child $k sum $s keys " . scalar(keys %h) . "\n";
            close $w;
            exit $k;
        }
        close $w;
        $kids{$pid} = [$k, $r];
    }
    my @lines;
    for my $pid (sort { $kids{$a}[0] <=> $kids{$b}[0] } keys %kids) {
        my ($k, $r) = @{ $kids{$pid} };
        my $line = <$r>;
        close $r;
        waitpid($pid, 0) == $pid or die "waitpid: $!";
        push @lines, $line . "child $k status " . ($? >> 8) . "\n";
    }
    print @lines if $round == $rounds;
    my $st = system('sh', '-c', 'exit 3');
    my $echo = `echo backtick`;
    print "system " . ($st >> 8) . ", $echo" if $round == $rounds;
}
print "done\n";
exit 0;
