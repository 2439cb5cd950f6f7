from textstats import word_count


def test_word_count():
    assert word_count("a  b\tc") == 3
    assert word_count("") == 0
